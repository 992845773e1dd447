//! Mutual TLS for TCP connections (rustls, TLS 1.3, the `ring` provider).
//!
//! A cluster that has a certificate authority gives every node (worker, client, and the
//! procs they spawn, which inherit the files) two PEM files: the CA's certificate
//! ([`TlsFiles::ca`]) and the node's private key followed by its certificate chain
//! ([`TlsFiles::key`]; the chain may instead be in a file of its own,
//! [`TlsFiles::cert`]). Every TCP connection is then a TLS session in which:
//!
//! - **TLS-1 (mutual)**: both ends present a certificate, and each end accepts the
//!   other's only if it chains to one of its CA certificates (the server with rustls's
//!   `WebPkiClientVerifier`, the client with [`CaVerifier`]); a peer without one is
//!   refused during the handshake, before a single frame is read;
//! - **TLS-2 (membership, not names)**: the peer's *name* is not checked. Peers are
//!   dialed by IP address, and the addresses a cluster advertises change (procs come
//!   and go, hosts are re-imaged), so a certificate cannot name them in advance: any
//!   certificate the CA signed is a member of the cluster. Whoever holds a key the CA
//!   certified can therefore serve at any address; a CA that signs for more than one
//!   cluster must not be used;
//! - **TLS-3 (confirmation)**: in TLS 1.3 the client finishes its handshake before the
//!   server has checked the client's certificate, so the server confirms with one byte
//!   ([`ACCEPTED`]) inside the session, and the client sends no frame before it has
//!   read it: a client the server refused learns why (the server's alert) at connect
//!   time, not at its first frame;
//! - frames are encrypted and integrity-checked, and there is no session resumption
//!   (every connection runs the whole handshake, with both certificates).
//!
//! Before the TLS handshake the server sends the first message of the
//! [`auth`](super) handshake with mode 2, so a peer of another mode (cluster secret,
//! trust all) fails at once with a message naming both modes, instead of waiting out
//! [`HANDSHAKE_TIMEOUT`].
//!
//! Loading checks the node's own certificate the way its peers will (chained to the CA,
//! usable for both TLS server and client authentication), so a misconfigured node fails
//! at start, naming the file, rather than at its first connection.
//!
//! ```no_run
//! use hyperactor::channel::auth::{set_tls, TlsFiles};
//! set_tls(&TlsFiles {
//!     ca: "/etc/monarch/ca.pem".into(),
//!     cert: None,
//!     key: "/etc/monarch/node.pem".into(),
//! })
//! .unwrap();
//! ```

use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{hello, hello_mismatch, AuthError, TcpAuth, HANDSHAKE_TIMEOUT, HELLO, MODE_TLS, NONCE};

/// The variable holding the path of the CA certificate(s) PEM file.
pub const TLS_CA_ENV: &str = "MONARCH_TLS_CA";
/// The variable holding the path of this node's private key PEM file (followed by its
/// certificate chain unless [`TLS_CERT_ENV`] is set).
pub const TLS_KEY_ENV: &str = "MONARCH_TLS_KEY";
/// The variable holding the path of this node's certificate chain PEM file (optional).
pub const TLS_CERT_ENV: &str = "MONARCH_TLS_CERT";

/// What the server sends, inside the TLS session, once it accepted the client (TLS-3).
pub const ACCEPTED: u8 = 1;

/// Where a node's TLS credentials are, all in PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificate(s) whose signature makes a peer a member of the cluster.
    pub ca: PathBuf,
    /// This node's certificate chain (its own certificate first), if not in `key`.
    pub cert: Option<PathBuf>,
    /// This node's private key, followed by its certificate chain when `cert` is
    /// `None`.
    pub key: PathBuf,
}

impl TlsFiles {
    /// The files the environment names ([`TLS_CA_ENV`], [`TLS_KEY_ENV`],
    /// [`TLS_CERT_ENV`]; empty counts as unset): `None` without a CA.
    ///
    /// # Errors
    ///
    /// [`TlsError::Config`] if a CA is given without a key.
    pub fn from_env() -> Result<Option<TlsFiles>, TlsError> {
        let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
        let Some(ca) = var(TLS_CA_ENV) else {
            return Ok(None);
        };
        let Some(key) = var(TLS_KEY_ENV) else {
            return Err(TlsError::Config {
                problem: format!(
                    "{TLS_CA_ENV} is set but {TLS_KEY_ENV} is not; set it to the PEM file \
                     of this node's private key and certificate chain"
                ),
            });
        };
        Ok(Some(TlsFiles {
            ca: ca.into(),
            cert: var(TLS_CERT_ENV).map(PathBuf::from),
            key: key.into(),
        }))
    }
}

/// Why TLS credentials cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file cannot be read, or does not hold what it should.
    #[error("TLS file {}: {problem}; {fix}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
        /// How to fix it.
        fix: &'static str,
    },
    /// The credentials do not fit together (for example the key is not the
    /// certificate's, or the certificate is not signed by the CA).
    #[error("TLS credentials: {problem}")]
    Config {
        /// What is wrong, naming the files.
        problem: String,
    },
}

/// A node's TLS configuration: the server and client sides, and the files it came from
/// (for [`child_env`](super::child_env)).
pub struct TlsConfig {
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    files: Option<TlsFiles>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

const PEM_FIX: &str = "give a PEM file (see docs/security.md for how to make one with openssl)";

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |problem: String| TlsError::File {
        path: path.to_path_buf(),
        problem,
        fix: PEM_FIX,
    };
    CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(format!("cannot read it: {e}")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not valid PEM: {e}")))
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::File {
        path: path.to_path_buf(),
        problem: match e {
            rustls::pki_types::pem::Error::NoItemsFound => "it holds no private key".into(),
            e => format!("cannot read a private key from it: {e}"),
        },
        fix: "give the PEM file of this node's private key (BEGIN PRIVATE KEY, EC PRIVATE \
              KEY or RSA PRIVATE KEY), followed by its certificate chain",
    })
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsConfig {
    /// Reads the files of `files` and checks that they fit together: the key is the
    /// certificate's, and the certificate chains to the CA and may authenticate both a
    /// TLS server and a client.
    ///
    /// # Errors
    ///
    /// A [`TlsError`] naming the file at fault and how to fix it.
    pub fn load(files: &TlsFiles) -> Result<TlsConfig, TlsError> {
        let absolute = |path: &Path| std::path::absolute(path).unwrap_or_else(|_| path.into());
        let files = TlsFiles {
            ca: absolute(&files.ca),
            cert: files.cert.as_deref().map(absolute),
            key: absolute(&files.key),
        };
        let roots = read_certs(&files.ca)?;
        if roots.is_empty() {
            return Err(TlsError::File {
                path: files.ca.clone(),
                problem: "it holds no certificate".into(),
                fix: "give the PEM file of the cluster's CA certificate (BEGIN CERTIFICATE)",
            });
        }
        let key = read_key(&files.key)?;
        let chain_file = files.cert.as_ref().unwrap_or(&files.key);
        let chain = read_certs(chain_file)?;
        if chain.is_empty() {
            return Err(TlsError::File {
                path: chain_file.clone(),
                problem: "it holds no certificate".into(),
                fix: "append this node's certificate (then any intermediate CA certificates) \
                      to its private key file, or give them in a file of their own \
                      (MONARCH_TLS_CERT)",
            });
        }
        let mut config =
            TlsConfig::new(roots.clone(), chain.clone(), key).map_err(|err| match err {
                TlsError::Config { problem } => TlsError::Config {
                    problem: format!(
                        "{problem} (CA {}, private key {}, certificate {})",
                        files.ca.display(),
                        files.key.display(),
                        chain_file.display()
                    ),
                },
                err => err,
            })?;
        check_own_chain(&roots, &chain).map_err(|problem| TlsError::Config {
            problem: format!(
                "this node's certificate ({}) is not accepted under the CA in {}: {problem}; \
                 every node's certificate must be signed by the cluster's CA and allow both \
                 serverAuth and clientAuth (see docs/security.md)",
                chain_file.display(),
                files.ca.display()
            ),
        })?;
        config.files = Some(files);
        Ok(config)
    }

    /// A configuration from certificates and a key in memory (no files for children,
    /// and no check of the node's own chain).
    ///
    /// # Errors
    ///
    /// [`TlsError::Config`] if rustls refuses them (a CA certificate it cannot parse, a
    /// key that is not the certificate's).
    pub fn new(
        ca: Vec<CertificateDer<'static>>,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<TlsConfig, TlsError> {
        let config = |what: &str, e: &dyn std::fmt::Display| TlsError::Config {
            problem: format!("{what}: {e}"),
        };
        let mut roots = RootCertStore::empty();
        for cert in ca {
            roots
                .add(cert)
                .map_err(|e| config("a CA certificate is not usable", &e))?;
        }
        let roots = Arc::new(roots);
        let provider = provider();
        let tls13: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
                .build()
                .map_err(|e| config("cannot verify clients with this CA", &e))?;
        let mut server = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(tls13)
            .map_err(|e| config("TLS 1.3 is not available", &e))?
            .with_client_cert_verifier(client_verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| config("the private key cannot be used with the certificate", &e))?;
        // No session resumption: every connection presents both certificates.
        server.send_tls13_tickets = 0;
        server.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        let verifier = Arc::new(CaVerifier {
            roots,
            provider: Arc::clone(&provider),
        });
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(tls13)
            .map_err(|e| config("TLS 1.3 is not available", &e))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_auth_cert(chain, key)
            .map_err(|e| config("the private key cannot be used with the certificate", &e))?;
        client.resumption = rustls::client::Resumption::disabled();
        Ok(TlsConfig {
            server: Arc::new(server),
            client: Arc::new(client),
            files: None,
        })
    }

    /// The files this configuration was loaded from (`None` if made in memory).
    pub fn files(&self) -> Option<&TlsFiles> {
        self.files.as_ref()
    }
}

/// Why a node's own certificate chain is not accepted under its CA
/// ([`check_own_chain`]); [`TlsConfig::load`] puts it in a [`TlsError::Config`] that
/// names the files.
#[derive(Debug, Clone, thiserror::Error)]
enum OwnChainError {
    /// A CA certificate cannot be used as a trust anchor.
    #[error("{0}")]
    Ca(#[source] rustls::Error),
    /// The chain is empty.
    #[error("there is no certificate")]
    NoCertificate,
    /// The node's certificate cannot be parsed.
    #[error("{0}")]
    Parse(#[source] rustls::Error),
    /// The certificate is not accepted for a TLS server.
    #[error("as a server: {0}")]
    AsServer(#[source] rustls::Error),
    /// No client verifier can be made with the CA.
    #[error("{0}")]
    Verifier(#[source] rustls::server::VerifierBuilderError),
    /// The certificate is not accepted for a TLS client.
    #[error("as a client: {0}")]
    AsClient(#[source] rustls::Error),
}

/// Checks a node's certificate chain as its peers will, as a server and as a client.
fn check_own_chain(
    ca: &[CertificateDer<'static>],
    chain: &[CertificateDer<'static>],
) -> Result<(), OwnChainError> {
    let mut roots = RootCertStore::empty();
    for cert in ca {
        roots.add(cert.clone()).map_err(OwnChainError::Ca)?;
    }
    let roots = Arc::new(roots);
    let provider = provider();
    let Some((end_entity, intermediates)) = chain.split_first() else {
        return Err(OwnChainError::NoCertificate);
    };
    let now = UnixTime::now();
    let parsed = ParsedCertificate::try_from(end_entity).map_err(OwnChainError::Parse)?;
    rustls::client::verify_server_cert_signed_by_trust_anchor(
        &parsed,
        &roots,
        intermediates,
        now,
        provider.signature_verification_algorithms.all,
    )
    .map_err(OwnChainError::AsServer)?;
    WebPkiClientVerifier::builder_with_provider(roots, provider)
        .build()
        .map_err(OwnChainError::Verifier)?
        .verify_client_cert(end_entity, intermediates, now)
        .map_err(OwnChainError::AsClient)?;
    Ok(())
}

/// Verifies a server's certificate chain against the cluster's CA and skips the name
/// check (TLS-2): peers are dialed by IP address and any certificate the CA signed is
/// a member of the cluster.
#[derive(Debug)]
pub struct CaVerifier {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for CaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The rustls error inside an I/O error of tokio-rustls, if any.
fn rustls_error(err: &io::Error) -> Option<&rustls::Error> {
    err.get_ref()?.downcast_ref::<rustls::Error>()
}

/// Why the server side of a TLS handshake failed, for its log line.
fn server_reason(err: io::Error) -> AuthError {
    match rustls_error(&err) {
        Some(
            e @ (rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented),
        ) => AuthError::UntrustedCertificate(e.clone()),
        Some(e @ rustls::Error::AlertReceived(_)) => AuthError::CertificateRefused(e.clone()),
        Some(e) => AuthError::Tls(e.clone()),
        None => AuthError::TlsIncomplete(err),
    }
}

/// Why the client side of a TLS handshake (or the wait for [`ACCEPTED`]) failed.
fn client_reason(err: &io::Error) -> String {
    match rustls_error(err) {
        Some(
            e @ (rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented),
        ) => {
            format!(
                "the peer's certificate is not signed by this process's CA, or not valid \
                 ({e}); every node's certificate must be signed by the CA given with ca= \
                 ({TLS_CA_ENV})"
            )
        }
        Some(e @ rustls::Error::AlertReceived(_)) => format!(
            "the peer refused this process's certificate ({e}); it must be signed by the \
             CA the peer trusts (both ends need the same ca=, {TLS_CA_ENV})"
        ),
        Some(e) => format!("the TLS handshake failed: {e}"),
        None => format!("the peer closed the connection during the TLS handshake ({err})"),
    }
}

/// Runs the server side of the TLS handshake on an accepted connection (TLS-1..3).
///
/// # Errors
///
/// An [`AuthError`] saying why the peer was rejected (the caller logs it and closes);
/// nothing was read from the peer but its handshake.
pub(crate) async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    tls: &TlsConfig,
) -> Result<tokio_rustls::server::TlsStream<S>, AuthError> {
    let run = async {
        stream
            .write_all(&hello(MODE_TLS, &[0u8; NONCE]))
            .await
            .map_err(AuthError::Write)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(&tls.server));
        let mut stream = acceptor.accept(stream).await.map_err(server_reason)?;
        stream
            .write_all(&[ACCEPTED])
            .await
            .map_err(AuthError::Write)?;
        stream.flush().await.map_err(AuthError::Write)?;
        Ok(stream)
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, run)
        .await
        .unwrap_or_else(|_| {
            Err(AuthError::TlsTimeout {
                after: HANDSHAKE_TIMEOUT,
            })
        })
}

/// Runs the client side of the TLS handshake on a new connection to `peer` (TLS-1..3).
///
/// # Errors
///
/// An `io::Error` (`PermissionDenied`) whose message starts with "TLS authentication
/// failed" and says why.
pub(crate) async fn connect<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    tls: &Arc<TlsConfig>,
    peer: IpAddr,
) -> io::Result<tokio_rustls::client::TlsStream<S>> {
    let denied = |reason: String| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("TLS authentication failed: {reason}"),
        )
    };
    let run = async {
        let mut first = [0u8; HELLO];
        stream.read_exact(&mut first).await.map_err(|e| {
            denied(format!(
                "the peer closed the connection before its handshake ({e}); it may not \
                 be a monarch process, or it refused this address"
            ))
        })?;
        if let Some(reason) = hello_mismatch(&first, &TcpAuth::Tls(Arc::clone(tls))) {
            return Err(denied(reason));
        }
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&tls.client));
        let mut stream = connector
            .connect(ServerName::IpAddress(peer.into()), stream)
            .await
            .map_err(|e| denied(client_reason(&e)))?;
        let mut accepted = [0u8; 1];
        stream
            .read_exact(&mut accepted)
            .await
            .map_err(|e| denied(client_reason(&e)))?;
        if accepted[0] != ACCEPTED {
            return Err(denied(format!(
                "the peer confirmed the handshake with {:#04x}, not {ACCEPTED:#04x}",
                accepted[0]
            )));
        }
        Ok(stream)
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, run)
        .await
        .unwrap_or_else(|_| {
            Err(denied(format!(
                "the peer did not complete the TLS handshake within {HANDSHAKE_TIMEOUT:?}"
            )))
        })
}
