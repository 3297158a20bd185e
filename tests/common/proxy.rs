//! A TCP proxy the test controls, to cut the network between the relay and the broker while
//! both stay up.

use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

#[derive(Default)]
struct State {
    cut: bool,
    connections: Vec<JoinHandle<()>>,
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

    /// Forwards every connection accepted on `listener` to `target` on loopback.
    pub fn forward_to(&mut self, listener: TcpListener, target: u16) {
        let state = self.state.clone();
        self.accept = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                if state.lock().unwrap().cut {
                    drop(client);
                    continue;
                }
                let conn = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(("127.0.0.1", target)).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
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
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
