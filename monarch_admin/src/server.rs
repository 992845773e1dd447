//! [`AdminServer`]: the listener, TLS, and the connection tasks.

use hyperactor::sync::Mutex;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::PrivateKeyDer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::auth;
use crate::auth::HostCheck;
use crate::config::{AdminConfig, AdminError};
use crate::routes::App;
use crate::series::Series;
use crate::snapshot::SnapshotCache;
use crate::source::Source;

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for open requests to finish.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// A running admin server. Dropping it stops accepting connections (without waiting);
/// [`AdminServer::shutdown`] also waits for open requests and ends event streams.
#[derive(Debug)]
pub struct AdminServer {
    local_addr: SocketAddr,
    token: String,
    scheme: &'static str,
    stop: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

fn tls_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, AdminError> {
    let certs = CertificateDer::pem_file_iter(cert)
        .map_err(|e| AdminError::Tls {
            path: cert.to_path_buf(),
            problem: format!("cannot read it: {e}"),
            fix: "give the path of a readable PEM certificate file",
        })?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| AdminError::Tls {
            path: cert.to_path_buf(),
            problem: format!("it is not valid PEM: {e}"),
            fix: "give a PEM file of BEGIN CERTIFICATE blocks, the server's first",
        })?;
    if certs.is_empty() {
        return Err(AdminError::Tls {
            path: cert.to_path_buf(),
            problem: "it holds no certificate".into(),
            fix: "give a PEM file of BEGIN CERTIFICATE blocks, the server's first",
        });
    }
    let private_key = PrivateKeyDer::from_pem_file(key).map_err(|e| AdminError::Tls {
        path: key.to_path_buf(),
        problem: format!("cannot read a private key from it: {e}"),
        fix: "give a PEM file holding the certificate's private key (BEGIN PRIVATE KEY, EC \
              PRIVATE KEY or RSA PRIVATE KEY)",
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(certs, private_key))
        .map_err(|e| AdminError::Tls {
            path: key.to_path_buf(),
            problem: format!("the certificate and key cannot be used together: {e}"),
            fix: "give the private key that belongs to the certificate",
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

impl AdminServer {
    /// Starts the server on the current tokio runtime (the caller's).
    ///
    /// # Errors
    ///
    /// [`AdminError::NoRuntime`] outside a runtime, or as [`AdminServer::start_on`].
    pub fn start(config: AdminConfig, source: Arc<dyn Source>) -> Result<AdminServer, AdminError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| AdminError::NoRuntime)?;
        AdminServer::start_on(&handle, config, source)
    }

    /// Starts the server on the runtime of `handle`; callable from any thread.
    ///
    /// # Errors
    ///
    /// [`AdminError::Bind`] if the address cannot be listened on, [`AdminError::Tls`] if
    /// the TLS files cannot be used, [`AdminError::Random`] if no token can be made,
    /// [`AdminError::Config`] for an empty token.
    pub fn start_on(
        handle: &tokio::runtime::Handle,
        config: AdminConfig,
        source: Arc<dyn Source>,
    ) -> Result<AdminServer, AdminError> {
        let token = match config.token {
            Some(t)
                if t.trim().is_empty()
                    || t.contains(|c: char| c.is_whitespace() || c == ';' || c == ',') =>
            {
                return Err(AdminError::Config(
                    "the token is empty or holds spaces, commas or semicolons; expected a \
                     cookie-safe string such as 64 hex digits; leave it unset to get a random one"
                        .into(),
                ))
            }
            Some(t) => t,
            None => auth::new_token()?,
        };
        let acceptor = match &config.tls {
            Some((cert, key)) => Some(tls_acceptor(cert, key)?),
            None => None,
        };
        let listener = std::net::TcpListener::bind(config.bind)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|source| AdminError::Bind {
                addr: config.bind,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| AdminError::Bind {
            addr: config.bind,
            source,
        })?;
        let listener = {
            let _entered = handle.enter();
            TcpListener::from_std(listener).map_err(|source| AdminError::Bind {
                addr: config.bind,
                source,
            })?
        };
        let (stop, stopped) = watch::channel(false);
        let cache = Arc::new(SnapshotCache::new(Arc::clone(&source)));
        let series = Arc::new(Series::new());
        let app = Arc::new(App {
            source,
            token: token.clone(),
            hosts: HostCheck::new(local_addr, &config.allowed_hosts),
            actions: config.actions,
            secure: acceptor.is_some(),
            cache: Arc::clone(&cache),
            series: Arc::clone(&series),
            shutdown: stopped.clone(),
            started_at: hyperactor_mesh::monitor::unix_now(),
        });
        let sampler = handle.spawn(Arc::clone(&series).run(cache, stopped.clone()));
        let accept = handle.spawn(accept_loop(listener, acceptor, app, stopped));
        Ok(AdminServer {
            local_addr,
            token,
            scheme: if config.tls.is_some() {
                "https"
            } else {
                "http"
            },
            stop,
            tasks: Mutex::new(vec![accept, sampler]),
        })
    }

    /// The address the server listens on (with the port picked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The access token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The base URL, without the token, e.g. `http://127.0.0.1:8265/`.
    pub fn base_url(&self) -> String {
        let host = match self.local_addr {
            SocketAddr::V4(a) if a.ip().is_unspecified() => format!("127.0.0.1:{}", a.port()),
            SocketAddr::V6(a) if a.ip().is_unspecified() => format!("[::1]:{}", a.port()),
            a => a.to_string(),
        };
        format!("{}://{host}/", self.scheme)
    }

    /// The URL to give users: the base URL with `?token=`.
    pub fn url(&self) -> String {
        format!("{}?token={}", self.base_url(), self.token)
    }

    /// Stops accepting connections, ends event streams, and waits (at most a few
    /// seconds) for open requests to finish. Idempotent.
    pub async fn shutdown(&self) {
        self.stop.send_replace(true);
        let tasks = std::mem::take(&mut *self.tasks.lock());
        for task in tasks {
            let _ = task.await;
        }
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: Option<TlsAcceptor>,
    app: Arc<App>,
    mut stopped: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    loop {
        if *stopped.borrow() {
            break;
        }
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, usually: wait instead of spinning.
                    tracing::warn!("admin server: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stopped.changed() => break,
        };
        let _ = stream.set_nodelay(true);
        let app = Arc::clone(&app);
        let service = service_fn(move |request| crate::routes::handle(Arc::clone(&app), request));
        let mut builder = hyper::server::conn::http1::Builder::new();
        // With a timer, a client that sends no complete request head within 30 s (the
        // default `header_read_timeout`) is cut off instead of holding a task forever.
        builder.timer(hyper_util::rt::TokioTimer::new());
        match &acceptor {
            None => {
                let connection = builder.serve_connection(TokioIo::new(stream), service);
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!("admin server: connection from {peer}: {e}");
                    }
                });
            }
            Some(acceptor) => {
                // The handshake runs in the connection's task, so a slow client cannot
                // hold up the accept loop; it is not watched by `graceful` until done.
                let acceptor = acceptor.clone();
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => {
                            tracing::debug!("admin server: TLS handshake with {peer} failed: {e}");
                            return;
                        }
                        Err(_) => return,
                    };
                    let connection = builder.serve_connection(TokioIo::new(tls), service);
                    if let Err(e) = watcher.watch(connection).await {
                        tracing::debug!("admin server: connection from {peer}: {e}");
                    }
                });
            }
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown()).await;
}
