//! A broker of the test's own (Apache Kafka, started by `scripts/broker.sh`), for tests that
//! need a broker configured differently from the suite's, or one they can cut off or stop.

use std::path::PathBuf;
use std::process::Command;

pub struct OwnBroker {
    /// The port the broker listens on.
    pub port: u16,
    /// The address clients are told to use.
    pub bootstrap: String,
    dir: tempfile::TempDir,
    /// How it was started, to start it again.
    options: Options,
}

/// How a test's own broker differs from the suite's.
#[derive(Clone, Default)]
pub struct Options {
    /// A port to advertise instead of the listener's (a proxy the test controls).
    pub advertised: Option<u16>,
    /// SASL/PLAIN with Kafka's authorizer: user `admin` (password `admin`) may do anything, user
    /// `relay` (password `relay`) only what [`OwnBroker::acl`] grants.
    pub sasl: bool,
    /// More `server.properties` lines.
    pub extra: Vec<String>,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/broker.sh")
}

/// Runs `cmd` (a `scripts/broker.sh` command) and returns what it printed, trimmed; panics
/// with `failed` and its errors when it fails.
fn run(cmd: &mut Command, failed: &str) -> String {
    let out = cmd.output().expect("scripts/broker.sh runs");
    assert!(
        out.status.success(),
        "{failed}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

impl OwnBroker {
    /// Starts a broker advertising `advertised` (a proxy's port) to its clients.
    pub fn start_advertising(advertised: u16) -> Self {
        Self::start(Options {
            advertised: Some(advertised),
            ..Options::default()
        })
    }

    /// Starts a broker; panics when it cannot (a test that needs a broker never passes without).
    pub fn start(options: Options) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let bootstrap = Self::launch(dir.path(), port, &options);
        Self {
            port,
            bootstrap,
            dir,
            options,
        }
    }

    /// Starts a second broker (node 2, the broker role only) in this broker's cluster, with
    /// this one's extra settings; this one stays its controller.
    pub fn join(&self) -> OwnBroker {
        let dir = tempfile::tempdir().unwrap();
        let bootstrap = run(
            Command::new(script())
                .arg("join")
                .arg(dir.path())
                .arg(self.dir.path())
                .env("BROKER_EXTRA", self.options.extra.join("\n")),
            "the second broker did not start",
        );
        let port = bootstrap.rsplit(':').next().unwrap().parse().unwrap();
        OwnBroker {
            port,
            bootstrap,
            dir,
            options: Options::default(),
        }
    }

    /// Starts again, as it was, a broker [`OwnBroker::stop`] stopped: its configuration, data
    /// and port.
    pub fn start_again(&self) {
        run(
            Command::new(script()).arg("resume").arg(self.dir.path()),
            "the broker did not start again",
        );
    }

    /// Stops the broker and starts it again on its data and port: a broker restart.
    pub fn restart(&mut self) {
        self.stop();
        Self::launch(self.dir.path(), self.port, &self.options);
    }

    /// Runs `scripts/broker.sh start` in `dir` (formatting it the first time); returns the
    /// bootstrap address.
    fn launch(dir: &std::path::Path, port: u16, options: &Options) -> String {
        let mut cmd = Command::new(script());
        cmd.arg("start")
            .arg(dir)
            .env("BROKER_PORT", port.to_string())
            .env("BROKER_EXTRA", options.extra.join("\n"));
        if let Some(a) = options.advertised {
            cmd.env("ADVERTISED_PORT", a.to_string());
        }
        if options.sasl {
            cmd.env("BROKER_SASL", "1");
        }
        run(&mut cmd, "broker did not start")
    }

    /// Runs one of Kafka's tools against this broker as its super user, e.g.
    /// `("org.apache.kafka.tools.AclCommand", ["--add", ...])`; panics when it fails.
    pub fn tool(&self, class: &str, args: &[&str]) -> String {
        let out = Command::new(script())
            .arg("kafka-class")
            .arg(self.dir.path())
            .arg(class)
            .args(["--bootstrap-server", &format!("127.0.0.1:{}", self.port)])
            .args(args)
            .output()
            .expect("scripts/broker.sh runs");
        assert!(
            out.status.success(),
            "{class} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Grants `principal` `operation` on the topic `name` (a literal name).
    pub fn acl(&self, principal: &str, operation: &str, topic: &str) {
        self.tool(
            "org.apache.kafka.tools.AclCommand",
            &[
                "--add",
                "--allow-principal",
                principal,
                "--operation",
                operation,
                "--topic",
                topic,
            ],
        );
    }

    /// The broker's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("broker.log")).unwrap_or_default()
    }

    /// Stops the broker (SIGTERM, then SIGKILL).
    pub fn stop(&mut self) {
        let _ = Command::new(script())
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        self.stop();
    }
}
