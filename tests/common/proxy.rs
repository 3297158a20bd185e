//! A TCP proxy the test controls, to cut the network between the relay and the broker (or the
//! API server) while both stay up, or to hold some of the relay's Kafka requests past their
//! timeouts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

#[derive(Default)]
struct State {
    cut: bool,
    connections: Vec<JoinHandle<()>>,
    hold: Option<Hold>,
}

/// Which requests to hold, and for how long.
#[derive(Clone, Debug)]
pub struct Hold {
    /// The Kafka API keys of the requests held (Produce is 0, EndTxn 26).
    pub api_keys: Vec<i16>,
    /// Every how many of those requests one is held.
    pub every: u64,
    /// How long each is held before it goes on to the broker.
    pub delay: Duration,
    /// How many to hold in all.
    pub limit: u64,
    /// How long after a held request went on before another may be held: time for the client
    /// to recover and get something through.
    pub gap: Duration,
    seen: u64,
    held: u64,
    /// Until when no request is held.
    quiet_until: Option<std::time::Instant>,
}

impl Hold {
    pub fn new(api_keys: &[i16], every: u64, delay: Duration, gap: Duration, limit: u64) -> Self {
        Self {
            api_keys: api_keys.to_vec(),
            every,
            delay,
            limit,
            gap,
            seen: 0,
            held: 0,
            quiet_until: None,
        }
    }

    /// Whether a request with `api_key` is held.
    fn take(&mut self, api_key: i16) -> bool {
        let now = std::time::Instant::now();
        if self.held >= self.limit
            || !self.api_keys.contains(&api_key)
            || self.quiet_until.is_some_and(|t| now < t)
        {
            return false;
        }
        self.seen += 1;
        let hold = self.seen.is_multiple_of(self.every);
        if hold {
            self.held += 1;
            self.quiet_until = Some(now + self.delay + self.gap);
        }
        hold
    }
}

/// What the proxied connections speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// Any protocol (HTTP to the API server): bytes are copied as they come, and requests
    /// cannot be held.
    Bytes,
    /// Kafka's protocol: requests are read frame by frame, so that some can be held.
    Kafka,
}

pub struct Proxy {
    pub port: u16,
    state: Arc<Mutex<State>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port; `target` is filled in by [`Proxy::forward_to`].
    pub async fn bind() -> (Self, TcpListener) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let proxy = Self {
            port,
            state: Arc::default(),
            accept: tokio::spawn(async {}),
        };
        (proxy, listener)
    }

    /// Forwards every connection accepted on `listener` to `target` on loopback, speaking
    /// `wire`.
    pub fn forward_to(&mut self, listener: TcpListener, target: u16, wire: Wire) {
        let state = self.state.clone();
        self.accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if state.lock().unwrap().cut {
                    drop(client);
                    continue;
                }
                let held = state.clone();
                let conn = tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    let (mut from_client, mut to_client) = client.into_split();
                    let (mut from_server, mut to_server) = server.into_split();
                    let answers = async move {
                        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                    };
                    // Request by request: a held one goes on after its delay, even once the
                    // client gave up on it and left (a late write), and holds those behind it.
                    let requests = async move {
                        if wire == Wire::Bytes {
                            let _ = tokio::io::copy(&mut from_client, &mut to_server).await;
                            let _ = to_server.shutdown().await;
                            return;
                        }
                        let mut frame = Vec::new();
                        loop {
                            let mut len = [0u8; 4];
                            if from_client.read_exact(&mut len).await.is_err() {
                                break;
                            }
                            let n = u32::from_be_bytes(len) as usize;
                            frame.resize(4 + n, 0);
                            frame[..4].copy_from_slice(&len);
                            if from_client.read_exact(&mut frame[4..]).await.is_err() {
                                break;
                            }
                            let api_key = match frame.get(4..6) {
                                Some(&[a, b]) => i16::from_be_bytes([a, b]),
                                _ => -1,
                            };
                            let delay = held
                                .lock()
                                .unwrap()
                                .hold
                                .as_mut()
                                .and_then(|h| h.take(api_key).then_some(h.delay));
                            if let Some(delay) = delay {
                                tokio::time::sleep(delay).await;
                            }
                            if to_server.write_all(&frame).await.is_err() {
                                break;
                            }
                        }
                        let _ = to_server.shutdown().await;
                    };
                    // One task: a cut aborts both ways at once.
                    tokio::join!(requests, answers);
                });
                state.lock().unwrap().connections.push(conn);
            }
        });
    }

    /// Cuts the network: open connections die, new ones are dropped at once.
    pub fn cut(&self) {
        let mut s = self.state.lock().unwrap();
        s.cut = true;
        for c in s.connections.drain(..) {
            c.abort();
        }
    }

    /// Restores the network.
    pub fn restore(&self) {
        self.state.lock().unwrap().cut = false;
    }

    /// Holds requests as `hold` says, from now on.
    pub fn hold(&self, hold: Hold) {
        self.state.lock().unwrap().hold = Some(hold);
    }

    /// How many requests were held so far.
    pub fn held(&self) -> u64 {
        self.state
            .lock()
            .unwrap()
            .hold
            .as_ref()
            .map_or(0, |h| h.held)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
