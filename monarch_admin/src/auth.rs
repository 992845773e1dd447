//! Access control: the token, its cookie, and the `Host` and `Origin` checks (spec
//! section 2).

use hyper::header::HeaderMap;
use hyper::header::AUTHORIZATION;
use hyper::header::COOKIE;
use hyper::header::HOST;
use hyper::header::ORIGIN;

use crate::config::AdminError;

/// The name of the cookie that carries the token.
pub(crate) const COOKIE_NAME: &str = "monarch_admin";

/// A new token: 32 bytes from the OS random number generator, hex.
pub(crate) fn new_token() -> Result<String, AdminError> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).map_err(|e| AdminError::Random(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Compares two strings in time that depends only on their lengths.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// The token a request presents, from `Authorization: Bearer` or the cookie.
fn presented(headers: &HeaderMap) -> Vec<&str> {
    let mut found = Vec::new();
    for value in headers.get_all(AUTHORIZATION) {
        if let Ok(v) = value.to_str() {
            if let Some(t) = v
                .strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
            {
                found.push(t.trim());
            }
        }
    }
    for value in headers.get_all(COOKIE) {
        if let Ok(v) = value.to_str() {
            for pair in v.split(';') {
                if let Some((name, val)) = pair.trim().split_once('=') {
                    if name.trim() == COOKIE_NAME {
                        found.push(val.trim());
                    }
                }
            }
        }
    }
    found
}

/// Whether the request carries the token (bearer or cookie).
pub(crate) fn authorized(headers: &HeaderMap, token: &str) -> bool {
    presented(headers)
        .iter()
        .any(|t| constant_time_eq(t.as_bytes(), token.as_bytes()))
}

/// Why [`HostCheck::check`] refused a request (answered with a 403 and this message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AuthRejected {
    /// The request has no (readable) `Host` header.
    #[error(
        "the request has no Host header; expected an HTTP/1.1 request with Host set to the \
         server's address; use the URL the program printed"
    )]
    NoHost,
    /// `Host` names a host the server does not answer to.
    #[error(
        "Host {host:?} is not allowed (a guard against DNS rebinding); expected one of \
         {allowed:?}; open the URL the program printed, or add the name to allowed_hosts"
    )]
    Host {
        /// The request's `Host`.
        host: String,
        /// The hosts allowed.
        allowed: Vec<String>,
    },
    /// `Origin` is not this server's.
    #[error(
        "Origin {origin:?} is not allowed (cross-site requests are refused); expected \
         http(s):// followed by one of {allowed:?}; use the dashboard served by this \
         server, or add its host to allowed_hosts"
    )]
    Origin {
        /// The request's `Origin`.
        origin: String,
        /// The hosts allowed.
        allowed: Vec<String>,
    },
}

/// The host names a request may address: checked against `Host` and `Origin`.
#[derive(Debug, Clone)]
pub(crate) struct HostCheck {
    allowed: Vec<String>,
}

impl HostCheck {
    /// The defaults for `port` and `bound` (the listening address), plus `extra` (names
    /// with or without a port).
    pub(crate) fn new(bound: std::net::SocketAddr, extra: &[String]) -> HostCheck {
        let port = bound.port();
        let mut allowed = vec![
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
            bound.to_string(),
        ];
        for name in extra {
            let name = name.trim().to_ascii_lowercase();
            if name.is_empty() {
                continue;
            }
            allowed.push(format!("{name}:{port}"));
            allowed.push(name);
        }
        HostCheck { allowed }
    }

    fn allows(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        self.allowed.contains(&host)
    }

    /// An [`AuthRejected`] (for a 403) unless `Host` and any `Origin` name an allowed
    /// host.
    pub(crate) fn check(&self, headers: &HeaderMap) -> Result<(), AuthRejected> {
        let host = headers.get(HOST).and_then(|h| h.to_str().ok());
        match host {
            None => return Err(AuthRejected::NoHost),
            Some(h) if !self.allows(h) => {
                return Err(AuthRejected::Host {
                    host: h.to_string(),
                    allowed: self.allowed.clone(),
                })
            }
            Some(_) => {}
        }
        if let Some(origin) = headers.get(ORIGIN) {
            let origin = origin.to_str().unwrap_or("");
            let name = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"));
            match name {
                Some(n) if self.allows(n.trim_end_matches('/')) => {}
                _ => {
                    return Err(AuthRejected::Origin {
                        origin: origin.to_string(),
                        allowed: self.allowed.clone(),
                    })
                }
            }
        }
        Ok(())
    }
}

/// Splits a raw query into `(token value, query without the token)`.
pub(crate) fn take_token(query: &str) -> (Option<String>, String) {
    let mut token = None;
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("token", v)) => token = Some(crate::http::percent_decode(v)),
            _ => rest.push(pair),
        }
    }
    (token, rest.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_64_hex_and_differ() {
        let (Ok(a), Ok(b)) = (new_token(), new_token()) else {
            panic!("no OS randomness");
        };
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }

    #[test]
    fn host_check_rejections_keep_their_messages() {
        use hyper::header::HeaderValue;
        let check = HostCheck::new(([127, 0, 0, 1], 8080).into(), &[]);
        let allowed = r#"["127.0.0.1:8080", "localhost:8080", "[::1]:8080", "127.0.0.1:8080"]"#;
        let mut headers = HeaderMap::new();
        let err = check.check(&headers).unwrap_err();
        assert_eq!(err, AuthRejected::NoHost);
        assert_eq!(
            err.to_string(),
            "the request has no Host header; expected an HTTP/1.1 request with Host set to \
             the server's address; use the URL the program printed"
        );
        headers.insert(HOST, HeaderValue::from_static("evil.example"));
        let err = check.check(&headers).unwrap_err();
        assert!(matches!(&err, AuthRejected::Host { host, .. } if host == "evil.example"));
        assert_eq!(
            err.to_string(),
            format!(
                "Host \"evil.example\" is not allowed (a guard against DNS rebinding); \
                 expected one of {allowed}; open the URL the program printed, or add the \
                 name to allowed_hosts"
            )
        );
        headers.insert(HOST, HeaderValue::from_static("localhost:8080"));
        assert_eq!(check.check(&headers), Ok(()));
        headers.insert(ORIGIN, HeaderValue::from_static("http://evil.example"));
        let err = check.check(&headers).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "Origin \"http://evil.example\" is not allowed (cross-site requests are \
                 refused); expected http(s):// followed by one of {allowed}; use the \
                 dashboard served by this server, or add its host to allowed_hosts"
            )
        );
        headers.insert(ORIGIN, HeaderValue::from_static("http://localhost:8080/"));
        assert_eq!(check.check(&headers), Ok(()));
    }

    #[test]
    fn token_is_taken_out_of_the_query() {
        assert_eq!(
            take_token("a=1&token=xyz&b=2"),
            (Some("xyz".into()), "a=1&b=2".into())
        );
        assert_eq!(take_token(""), (None, String::new()));
    }
}
