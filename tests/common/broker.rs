//! A broker of the test's own, behind a proxy the test controls: cutting the proxy cuts the
//! network between the relay and the broker while the broker stays up (its in-memory log
//! survives; a restarted broker's might not).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct OwnBroker {
    pub port: u16,
    /// The address clients are told to use (the proxy's).
    advertised: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl OwnBroker {
    /// Panics when tansu is not installed (the suite's broker script installs it): a test that
    /// needs a broker never passes without one.
    pub fn start_advertising(advertised: u16) -> Self {
        Command::new("tansu")
            .arg("--version")
            .output()
            .expect("tansu is not installed: this test needs a broker it can stop (scripts/broker.sh install)");
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut b = Self {
            port,
            advertised,
            dir,
            child: None,
        };
        b.resume();
        b
    }

    /// Starts on its port, advertising the proxy's.
    fn resume(&mut self) {
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let advertised = format!("tcp://127.0.0.1:{}", self.advertised);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("broker.log"))
            .unwrap();
        let child = Command::new("tansu")
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &advertised,
                "--storage-engine",
                "memory://tansu/",
            ])
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("tansu starts");
        self.child = Some(child);
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("broker did not listen on {}", self.port);
    }

    /// Kills the broker outright.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        self.kill();
    }
}
