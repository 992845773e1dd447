//! The server's configuration and errors.

use std::net::SocketAddr;
use std::path::PathBuf;

/// How an [`AdminServer`](crate::server::AdminServer) listens and whom it lets in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConfig {
    /// The address to listen on; port 0 picks a free port. Default `127.0.0.1:0`.
    pub bind: SocketAddr,
    /// Host names (with or without `:port`) accepted in `Host` and `Origin` besides
    /// `127.0.0.1`, `localhost`, `[::1]` and the bound address.
    pub allowed_hosts: Vec<String>,
    /// Whether the action routes (`POST /v1/actions/...`) are enabled.
    pub actions: bool,
    /// TLS certificate chain and private key, both PEM files: then the server speaks
    /// HTTPS only.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// The access token; `None` makes a random one (32 bytes from the OS, hex).
    pub token: Option<String>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            allowed_hosts: Vec::new(),
            actions: false,
            tls: None,
            token: None,
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The listening socket could not be opened.
    #[error(
        "the admin server cannot listen on {addr}: {source}; expected a free local address \
         (port 0 picks any free port); choose another address or port"
    )]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A TLS file could not be used.
    #[error(
        "the admin server cannot use TLS file {path}: {problem}; expected a PEM certificate \
         chain and its PEM private key; {fix}"
    )]
    Tls {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
        /// How to fix it.
        fix: &'static str,
    },
    /// A recorded job file could not be read.
    #[error(
        "cannot open the recorded job {path}: {problem}; expected a JSON object with the \
         keys summary, snapshot, events, logs and series (see \
         tests/monitoring/fixtures/recorded.json); record a job again or fix the file"
    )]
    Recorded {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A setting is invalid.
    #[error("invalid admin server setting: {0}")]
    Config(String),
    /// `start` was called outside a tokio runtime.
    #[error(
        "AdminServer::start was called outside a tokio runtime; expected to run on the \
         caller's runtime; call it from within the runtime or use AdminServer::start_on \
         with a runtime handle"
    )]
    NoRuntime,
    /// The OS random number generator failed.
    #[error(
        "cannot make an access token: the OS random number generator failed ({0}); give a \
         token in AdminConfig.token instead"
    )]
    Random(String),
}
