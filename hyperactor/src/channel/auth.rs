//! Authentication of TCP connections, before a single frame is decoded.
//!
//! Every TCP connection starts with a handshake; frames flow only once it succeeded.
//! Unix sockets need none: they live in a directory only their user can open (see
//! [`crate::channel::socket_dir`]).
//!
//! Three modes, chosen per process ([`set_tls`], [`set_cluster_secret`],
//! [`set_trust_all`], or the environment, see below), and both ends must use the same
//! one:
//!
//! - **mutual TLS** (when a CA and a key are given): both ends present a certificate
//!   signed by the cluster's CA, and the connection is a TLS 1.3 session (rustls), so
//!   frames are also encrypted and integrity-checked. See [`tls`] for what is verified
//!   (the chain to the CA, not the peer's name).
//! - **cluster secret** (the default): both ends prove that they know the same secret
//!   with a mutual challenge-response (HMAC-SHA256 over fresh 32-byte nonces from both
//!   sides), so a peer that does not know it can neither send frames nor receive any.
//!   The secret itself never crosses the wire. A process that was given no secret makes
//!   a random one: its children (procs a host spawns) inherit it through
//!   [`child_env`], so one machine works with no set-up; processes on other machines
//!   need the same secret ([`CLUSTER_SECRET_ENV`]).
//! - **trust all**: no proof, for networks where every peer is trusted. It must be
//!   asked for explicitly and logs a warning.
//!
//! The handshake (all numbers little-endian, server speaks first):
//!
//! ```text
//! server -> client: MAGIC (8) | mode (1) | nonce_s (32)
//! client -> server: MAGIC (8) | mode (1) | nonce_c (32) | HMAC(k, "monarch-client" | nonce_s | nonce_c) (32)
//! server -> client: HMAC(k, "monarch-server" | nonce_c | nonce_s) (32)
//! ```
//!
//! where `k` is the SHA-256 of the secret, and the MACs are zeros in trust-all mode. In
//! TLS mode the server's first message is the same (mode 2, zeros for the nonce, so
//! that a peer of another mode reads a whole one and reports the mismatch), then comes
//! a TLS handshake (see [`tls`]). A server that does not like what it reads (not the
//! magic, another mode, a wrong MAC or certificate, nothing within
//! [`HANDSHAKE_TIMEOUT`]) closes the connection and logs one line (rate-limited); it
//! never reads further. The client checks the server's MAC (or certificate) too, so it
//! never sends a frame to a peer that does not know the secret.
//!
//! Not protected with a cluster secret: the traffic itself is neither encrypted nor
//! integrity-checked after the handshake (someone who can inject packets into an
//! established connection on the network path can still tamper with it). Mutual TLS
//! protects it.
//!
//! | environment variable | meaning |
//! |---|---|
//! | [`TLS_CA_ENV`] (`MONARCH_TLS_CA`) | mutual TLS: the PEM file of the cluster's CA certificate(s) |
//! | [`TLS_KEY_ENV`] (`MONARCH_TLS_KEY`) | mutual TLS: the PEM file of this node's private key, and its certificate chain unless [`TLS_CERT_ENV`] is set |
//! | [`TLS_CERT_ENV`] (`MONARCH_TLS_CERT`) | mutual TLS, optional: the PEM file of this node's certificate chain |
//! | [`CLUSTER_SECRET_ENV`] (`MONARCH_CLUSTER_SECRET`) | the cluster secret (any non-empty string) |
//! | [`CLUSTER_AUTH_ENV`] (`MONARCH_CLUSTER_AUTH`) | `trust_all` for trust-all mode |
//!
//! An empty variable counts as unset. `MONARCH_TLS_CA` wins over the others (and a
//! process whose TLS files cannot be loaded logs why and makes a random secret, so its
//! connections fail rather than fall back to a weaker mode); then `trust_all`; then the
//! secret.

pub mod tls;

pub use self::tls::{TlsConfig, TlsError, TlsFiles, TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV};

use crate::sync::RwLock;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The variable holding the cluster secret.
pub const CLUSTER_SECRET_ENV: &str = "MONARCH_CLUSTER_SECRET";
/// The variable that selects trust-all mode (value `trust_all`).
pub const CLUSTER_AUTH_ENV: &str = "MONARCH_CLUSTER_AUTH";
/// How long either side of a handshake waits for the other.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

const MAGIC: &[u8; 8] = b"MONARCH\x01";
const MODE_TRUST_ALL: u8 = 0;
const MODE_SECRET: u8 = 1;
const MODE_TLS: u8 = 2;
const NONCE: usize = 32;
const MAC: usize = 32;
/// The length of the server's first message.
const HELLO: usize = 8 + 1 + NONCE;

/// How this process authenticates its TCP connections.
#[derive(Clone)]
pub enum TcpAuth {
    /// Mutual challenge-response over a shared secret.
    Secret(Arc<Secret>),
    /// No authentication (explicit opt-in).
    TrustAll,
    /// Mutual TLS with certificates signed by the cluster's CA.
    Tls(Arc<TlsConfig>),
}

impl std::fmt::Debug for TcpAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TcpAuth::Secret(_) => f.write_str("TcpAuth::Secret(..)"),
            TcpAuth::TrustAll => f.write_str("TcpAuth::TrustAll"),
            TcpAuth::Tls(_) => f.write_str("TcpAuth::Tls(..)"),
        }
    }
}

impl TcpAuth {
    /// The cluster-secret mode with `text` as the secret, without making it this
    /// process's mode.
    #[cfg(test)]
    pub(crate) fn secret(text: &str) -> TcpAuth {
        TcpAuth::Secret(Arc::new(Secret::new(text.into())))
    }
}

/// A cluster secret: its text (for children) and the key derived from it.
pub struct Secret {
    text: String,
    key: [u8; 32],
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    fn new(text: String) -> Self {
        let key = Sha256::digest(text.as_bytes()).into();
        Self { text, key }
    }

    fn hmac(&self, label: &[u8], first: &[u8], second: &[u8]) -> Hmac<Sha256> {
        // invariant: HMAC accepts keys of any length.
        #[allow(clippy::expect_used)]
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.key).expect("invariant: any key length works");
        mac.update(label);
        mac.update(first);
        mac.update(second);
        mac
    }

    fn mac(&self, label: &[u8], first: &[u8], second: &[u8]) -> [u8; MAC] {
        self.hmac(label, first, second)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Constant-time comparison of `tag` with the MAC of the inputs.
    fn verify(&self, label: &[u8], first: &[u8], second: &[u8], tag: &[u8]) -> bool {
        self.hmac(label, first, second).verify_slice(tag).is_ok()
    }
}

/// Why a cluster secret cannot be used ([`set_cluster_secret`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterSecretError {
    /// The secret is the empty string.
    #[error(
        "the cluster secret is empty; give a non-empty string (for example the \
         output of `openssl rand -hex 32`) in {env}",
        env = CLUSTER_SECRET_ENV
    )]
    Empty,
}

/// Why the server side of a handshake rejected a TCP connection (the cluster secret
/// and trust-all handshakes, and the mutual TLS one). The messages speak of the peer ("it ..."): the
/// server logs them after the peer's address.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The cluster-secret handshake was asked to run in mutual TLS mode, which
    /// `tls::accept` runs (a bug of the caller).
    #[error("mutual TLS is accepted by tls::accept")]
    TlsNotHere,
    /// Writing this process's part of the handshake failed.
    #[error("writing the handshake failed: {0}")]
    Write(#[source] std::io::Error),
    /// The peer ended the connection (or reading failed) before its whole answer.
    #[error(
        "it did not complete the handshake ({source}); it may use another \
         authentication mode than {expected}"
    )]
    Incomplete {
        /// Why reading failed.
        #[source]
        source: std::io::Error,
        /// This process's authentication mode, in words.
        expected: &'static str,
    },
    /// The peer's first bytes are not a monarch handshake.
    #[error("it is not a monarch peer (its first bytes are not a handshake)")]
    NotMonarch,
    /// The peer uses another authentication mode than this process.
    #[error("it uses {peer} but this process requires {expected}")]
    ModeMismatch {
        /// The peer's mode, in words.
        peer: &'static str,
        /// This process's mode, in words.
        expected: &'static str,
    },
    /// The peer's answer was not made with this process's cluster secret.
    #[error("it does not know the cluster secret")]
    WrongSecret,
    /// The peer did not complete the handshake in time.
    #[error("it did not complete the handshake within {after:?}")]
    Timeout {
        /// How long the server waited ([`HANDSHAKE_TIMEOUT`]).
        after: Duration,
    },
    /// Mutual TLS: the peer's certificate is missing, not signed by this process's CA,
    /// or not valid.
    #[error("its certificate is not signed by this process's CA, or not valid ({0})")]
    UntrustedCertificate(#[source] rustls::Error),
    /// Mutual TLS: the peer refused this process's certificate (its alert).
    #[error("it refused this process's certificate ({0})")]
    CertificateRefused(#[source] rustls::Error),
    /// Mutual TLS: the TLS handshake failed for another reason (for example the peer
    /// sent something that is not TLS).
    #[error("the TLS handshake failed: {0}")]
    Tls(#[source] rustls::Error),
    /// Mutual TLS: the peer ended the connection (or reading failed) during the TLS
    /// handshake.
    #[error(
        "it did not complete the TLS handshake ({0}); it may use another \
         authentication mode than mutual TLS"
    )]
    TlsIncomplete(#[source] std::io::Error),
    /// Mutual TLS: the peer did not complete the TLS handshake in time.
    #[error("it did not complete the TLS handshake within {after:?}")]
    TlsTimeout {
        /// How long the server waited ([`HANDSHAKE_TIMEOUT`]).
        after: Duration,
    },
}

fn configured() -> &'static RwLock<Option<TcpAuth>> {
    static AUTH: OnceLock<RwLock<Option<TcpAuth>>> = OnceLock::new();
    AUTH.get_or_init(|| RwLock::new(None))
}

/// Uses `secret` for the TCP connections this process makes and accepts from now on.
///
/// # Errors
///
/// [`ClusterSecretError::Empty`] if `secret` is empty; the mode in force is then
/// unchanged.
pub fn set_cluster_secret(secret: &str) -> Result<(), ClusterSecretError> {
    if secret.is_empty() {
        return Err(ClusterSecretError::Empty);
    }
    *configured().write() = Some(TcpAuth::Secret(Arc::new(Secret::new(secret.to_string()))));
    Ok(())
}

/// Accepts and makes TCP connections without authentication from now on (logs a
/// warning: anyone who can reach this process's TCP ports can send it messages).
pub fn set_trust_all() {
    tracing::warn!(
        "TCP connections of this process are NOT authenticated (trust_all_connections): \
         anyone who can reach its ports can send it messages and run code in it; set a \
         cluster secret ({CLUSTER_SECRET_ENV}) instead where the network is shared"
    );
    *configured().write() = Some(TcpAuth::TrustAll);
}

/// Uses mutual TLS with the credentials in `files` for the TCP connections this process
/// makes and accepts from now on (see [`tls`]); its children inherit the file paths
/// ([`child_env`]).
///
/// # Errors
///
/// A [`TlsError`] naming the file that cannot be read or used, and how to fix it; the
/// mode in force is then unchanged.
pub fn set_tls(files: &TlsFiles) -> Result<(), TlsError> {
    let config = TlsConfig::load(files)?;
    *configured().write() = Some(TcpAuth::Tls(Arc::new(config)));
    Ok(())
}

/// The mode in force: the one set, else the environment's, else a random secret made
/// once per process.
pub fn tcp_auth() -> TcpAuth {
    if let Some(auth) = configured().read().clone() {
        return auth;
    }
    let mut slot = configured().write();
    if let Some(auth) = slot.clone() {
        return auth;
    }
    let auth = from_env().unwrap_or_else(|| TcpAuth::Secret(Arc::new(Secret::new(random_hex()))));
    *slot = Some(auth.clone());
    auth
}

fn from_env() -> Option<TcpAuth> {
    match TlsFiles::from_env() {
        Ok(None) => {}
        Ok(Some(files)) => match TlsConfig::load(&files) {
            Ok(config) => return Some(TcpAuth::Tls(Arc::new(config))),
            Err(err) => {
                tracing::error!(
                    "{TLS_CA_ENV} is set but the TLS credentials cannot be used: {err}; this \
                     process's TCP connections will fail"
                );
                return None;
            }
        },
        Err(err) => {
            tracing::error!("{err}; this process's TCP connections will fail");
            return None;
        }
    }
    if std::env::var(CLUSTER_AUTH_ENV).is_ok_and(|v| v == "trust_all") {
        tracing::warn!(
            "TCP connections of this process are NOT authenticated ({CLUSTER_AUTH_ENV}=trust_all)"
        );
        return Some(TcpAuth::TrustAll);
    }
    match std::env::var(CLUSTER_SECRET_ENV) {
        Ok(text) if !text.is_empty() => Some(TcpAuth::Secret(Arc::new(Secret::new(text)))),
        _ => None,
    }
}

/// The environment that makes a child process use this process's mode and credentials.
///
/// It names every variable of the table in the [module docs](self), the ones of other
/// modes empty (unset), so that what the child inherits from this process's own
/// environment cannot select another mode.
pub fn child_env() -> Vec<(String, String)> {
    let mut secret = String::new();
    let mut mode = String::new();
    let (mut ca, mut cert, mut key) = (String::new(), String::new(), String::new());
    match tcp_auth() {
        TcpAuth::Secret(s) => secret.clone_from(&s.text),
        TcpAuth::TrustAll => mode = "trust_all".to_string(),
        TcpAuth::Tls(config) => {
            // A configuration made in memory (tests) has no files to hand down: the
            // child then makes a random secret and cannot connect, which is safe.
            if let Some(files) = config.files() {
                ca = files.ca.display().to_string();
                key = files.key.display().to_string();
                if let Some(path) = &files.cert {
                    cert = path.display().to_string();
                }
            }
        }
    }
    [
        (CLUSTER_SECRET_ENV, secret),
        (CLUSTER_AUTH_ENV, mode),
        (TLS_CA_ENV, ca),
        (TLS_CERT_ENV, cert),
        (TLS_KEY_ENV, key),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_string(), value))
    .collect()
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    let mut filled = 0;
    while filled < N {
        // SAFETY: the pointer and length describe the unfilled tail of `buf`.
        let n = unsafe {
            libc::getrandom(
                buf[filled..].as_mut_ptr().cast::<libc::c_void>(),
                N - filled,
                0,
            )
        };
        if n > 0 {
            filled += n as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // invariant: getrandom only fails on ancient kernels; without entropy nothing
            // here can be secure, so stop loudly.
            #[allow(clippy::panic)]
            {
                panic!(
                    "getrandom failed: {}; no secure random numbers",
                    std::io::Error::last_os_error()
                );
            }
        }
    }
    buf
}

fn random_hex() -> String {
    random_bytes::<32>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn mode_of(auth: &TcpAuth) -> u8 {
    match auth {
        TcpAuth::Secret(_) => MODE_SECRET,
        TcpAuth::TrustAll => MODE_TRUST_ALL,
        TcpAuth::Tls(_) => MODE_TLS,
    }
}

/// The server's first message: [`MAGIC`], the mode, and a nonce (zeros in TLS mode).
fn hello(mode: u8, nonce: &[u8; NONCE]) -> [u8; HELLO] {
    let mut hello = [0u8; HELLO];
    hello[..8].copy_from_slice(MAGIC);
    hello[8] = mode;
    hello[9..].copy_from_slice(nonce);
    hello
}

/// Why a server's first message is not acceptable to a client of `auth`'s mode, or
/// `None` if it is.
fn hello_mismatch(hello: &[u8; HELLO], auth: &TcpAuth) -> Option<String> {
    if &hello[..8] != MAGIC {
        return Some(
            "the peer is not a monarch process (its first bytes are not a handshake)".into(),
        );
    }
    let mode = hello[8];
    (mode != mode_of(auth)).then(|| {
        format!(
            "the peer requires {} but this process uses {}; give both the same setting: \
             mutual TLS (ca= and private_key=, or {TLS_CA_ENV} and {TLS_KEY_ENV}), a \
             cluster secret ({CLUSTER_SECRET_ENV}), or ca=\"trust_all_connections\"",
            mode_name(mode),
            mode_name(mode_of(auth))
        )
    })
}

fn mode_name(mode: u8) -> &'static str {
    match mode {
        MODE_SECRET => "a cluster secret",
        MODE_TRUST_ALL => "no authentication (trust_all_connections)",
        MODE_TLS => "mutual TLS",
        _ => "an unknown authentication mode",
    }
}

/// Runs the server side of the handshake on an accepted connection, in the cluster
/// secret and trust-all modes ([`tls::accept`] runs the TLS one).
///
/// # Errors
///
/// An [`AuthError`] saying why the peer was rejected (the caller logs it and closes).
pub(crate) async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    auth: &TcpAuth,
) -> Result<(), AuthError> {
    let secret = match auth {
        TcpAuth::Secret(secret) => Some(secret),
        TcpAuth::TrustAll => None,
        TcpAuth::Tls(_) => return Err(AuthError::TlsNotHere),
    };
    let run = async {
        let nonce_s: [u8; NONCE] = random_bytes();
        stream
            .write_all(&hello(mode_of(auth), &nonce_s))
            .await
            .map_err(AuthError::Write)?;
        let mut answer = [0u8; HELLO + MAC];
        stream
            .read_exact(&mut answer)
            .await
            .map_err(|source| AuthError::Incomplete {
                source,
                expected: mode_name(mode_of(auth)),
            })?;
        if &answer[..8] != MAGIC {
            return Err(AuthError::NotMonarch);
        }
        let mode = answer[8];
        if mode != mode_of(auth) {
            return Err(AuthError::ModeMismatch {
                peer: mode_name(mode),
                expected: mode_name(mode_of(auth)),
            });
        }
        let nonce_c = &answer[9..HELLO];
        let tag = &answer[HELLO..];
        let reply = match secret {
            Some(secret) => {
                if !secret.verify(b"monarch-client", &nonce_s, nonce_c, tag) {
                    // Answer zeros so the client reports a failed authentication, not a
                    // dropped connection.
                    let _ = stream.write_all(&[0u8; MAC]).await;
                    return Err(AuthError::WrongSecret);
                }
                secret.mac(b"monarch-server", nonce_c, &nonce_s)
            }
            None => [0u8; MAC],
        };
        stream.write_all(&reply).await.map_err(AuthError::Write)
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, run)
        .await
        .unwrap_or_else(|_| {
            Err(AuthError::Timeout {
                after: HANDSHAKE_TIMEOUT,
            })
        })
}

/// Runs the client side of the handshake on a new connection, in the cluster secret
/// and trust-all modes ([`tls::connect`] runs the TLS one).
///
/// # Errors
///
/// An `io::Error` (`PermissionDenied`) saying why authentication failed.
pub(crate) async fn connect<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    auth: &TcpAuth,
) -> std::io::Result<()> {
    let denied = |reason: String| {
        std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("authentication failed: {reason}"),
        )
    };
    let secret = match auth {
        TcpAuth::Secret(secret) => Some(secret),
        TcpAuth::TrustAll => None,
        TcpAuth::Tls(_) => return Err(denied("mutual TLS is dialed by tls::connect".into())),
    };
    let run = async {
        let mut hello = [0u8; HELLO];
        stream.read_exact(&mut hello).await.map_err(|e| {
            denied(format!(
                "the peer closed the connection before its handshake ({e}); it may not \
                 be a monarch process, or it refused this address"
            ))
        })?;
        if let Some(reason) = hello_mismatch(&hello, auth) {
            return Err(denied(reason));
        }
        let nonce_s = &hello[9..];
        let nonce_c: [u8; NONCE] = random_bytes();
        let tag = match secret {
            Some(secret) => secret.mac(b"monarch-client", nonce_s, &nonce_c),
            None => [0u8; MAC],
        };
        let mut answer = Vec::with_capacity(HELLO + MAC);
        answer.extend_from_slice(MAGIC);
        answer.push(mode_of(auth));
        answer.extend_from_slice(&nonce_c);
        answer.extend_from_slice(&tag);
        stream.write_all(&answer).await?;
        let mut reply = [0u8; MAC];
        stream.read_exact(&mut reply).await.map_err(|e| {
            denied(format!(
                "the peer closed the connection during the handshake ({e})"
            ))
        })?;
        if let Some(secret) = secret {
            if !secret.verify(b"monarch-server", &nonce_c, nonce_s, &reply) {
                return Err(denied(format!(
                    "the peer does not share this process's cluster secret; give every \
                     process of the cluster the same {CLUSTER_SECRET_ENV}"
                )));
            }
        }
        Ok(())
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, run)
        .await
        .unwrap_or_else(|_| {
            Err(denied(format!(
                "the peer did not complete the handshake within {HANDSHAKE_TIMEOUT:?}"
            )))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(text: &str) -> TcpAuth {
        TcpAuth::Secret(Arc::new(Secret::new(text.into())))
    }

    async fn pair(
        server: TcpAuth,
        client: TcpAuth,
    ) -> (Result<(), AuthError>, std::io::Result<()>) {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let s = tokio::spawn(async move { accept(&mut a, &server).await });
        let c = connect(&mut b, &client).await;
        drop(b);
        (s.await.unwrap(), c)
    }

    #[tokio::test]
    async fn same_secret_authenticates_both_ways() {
        let (s, c) = pair(secret("k1"), secret("k1")).await;
        assert!(s.is_ok(), "{s:?}");
        assert!(c.is_ok(), "{c:?}");
    }

    #[tokio::test]
    async fn a_different_secret_is_rejected_by_both_sides() {
        let (s, c) = pair(secret("k1"), secret("k2")).await;
        let err = s.unwrap_err();
        assert!(matches!(err, AuthError::WrongSecret), "{err:?}");
        assert_eq!(err.to_string(), "it does not know the cluster secret");
        let err = c.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(err.to_string().contains("cluster secret"), "{err}");
    }

    #[tokio::test]
    async fn mixed_modes_are_rejected_with_a_reason() {
        let (s, c) = pair(secret("k1"), TcpAuth::TrustAll).await;
        let err = s.unwrap_err();
        // The client sees the mismatch in the server's first message and hangs up.
        assert!(matches!(err, AuthError::Incomplete { .. }), "{err:?}");
        assert!(
            err.to_string()
                .ends_with("; it may use another authentication mode than a cluster secret"),
            "{err}"
        );
        assert!(c
            .unwrap_err()
            .to_string()
            .contains("requires a cluster secret"));
        let (_, c) = pair(TcpAuth::TrustAll, TcpAuth::TrustAll).await;
        assert!(c.is_ok());
    }

    #[tokio::test]
    async fn garbage_is_rejected_before_anything_is_decoded() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let server = tokio::spawn(async move { accept(&mut a, &secret("k")).await });
        let mut hello = [0u8; 41];
        b.read_exact(&mut hello).await.unwrap();
        // A pickle, as an attacker would send to a worker port.
        let mut pickle =
            b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00cos\nsystem\n(S'id'\ntR.".to_vec();
        pickle.resize(128, b'.');
        b.write_all(&pickle).await.unwrap();
        let err = server.await.unwrap().unwrap_err();
        assert!(matches!(err, AuthError::NotMonarch), "{err:?}");
        assert!(err.to_string().contains("not a monarch peer"), "{err}");
    }

    #[test]
    fn an_empty_cluster_secret_is_refused_naming_the_variable() {
        let err = set_cluster_secret("").unwrap_err();
        assert_eq!(err, ClusterSecretError::Empty);
        assert_eq!(
            err.to_string(),
            "the cluster secret is empty; give a non-empty string (for example the output \
             of `openssl rand -hex 32`) in MONARCH_CLUSTER_SECRET"
        );
    }

    #[test]
    fn child_env_carries_the_mode_and_clears_the_others() {
        let env = child_env();
        let names: Vec<&str> = env.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            [
                CLUSTER_SECRET_ENV,
                CLUSTER_AUTH_ENV,
                TLS_CA_ENV,
                TLS_CERT_ENV,
                TLS_KEY_ENV
            ]
        );
        // Exactly one mode is selected: a secret or trust_all (no test sets TLS
        // process-wide), the TLS variables empty.
        let set: Vec<&str> = env
            .iter()
            .filter(|(_, value)| !value.is_empty())
            .map(|(name, _)| name.as_str())
            .collect();
        assert_eq!(set.len(), 1, "{env:?}");
        assert!(set[0] == CLUSTER_SECRET_ENV || set[0] == CLUSTER_AUTH_ENV);
    }
}
