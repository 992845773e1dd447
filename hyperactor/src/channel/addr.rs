//! Channel addresses and transports.
//!
//! A [`ChannelAddr`] names an endpoint that [`crate::channel::serve`] binds
//! and [`crate::channel::dial`] connects to. Each address belongs to one
//! [`ChannelTransport`]: `local` (in-process), `unix` (Unix domain socket)
//! or `tcp`.
//!
//! Invariant: an address has exactly one printable form, and it parses
//! back to the same address (`"local:7"`, `"unix:/tmp/x.sock"`,
//! `"tcp:127.0.0.1:4000"`, `"tcp:[::1]:4000"`). Serde uses that string
//! form. (A Unix path that is not UTF-8 prints lossily and does not round
//! trip.)
//!
//! ```
//! use hyperactor::channel::{ChannelAddr, ChannelTransport};
//! let addr: ChannelAddr = "tcp:[::1]:4000".parse().unwrap();
//! assert_eq!(addr.transport(), ChannelTransport::Tcp);
//! assert_eq!(addr.to_string(), "tcp:[::1]:4000");
//! ```

use std::fmt;
use std::net::Ipv4Addr;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::SystemTime;
use std::time::UNIX_EPOCH;

use serde::Deserialize;
use serde::Deserializer;
use serde::Serialize;
use serde::Serializer;

use super::error::ChannelError;
use super::socket_dir::socket_dir;

/// The kind of transport an address uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChannelTransport {
    /// In-process: frames are moved between tasks, never serialised.
    Local,
    /// Unix domain stream sockets.
    Unix,
    /// TCP (with `TCP_NODELAY`).
    Tcp,
}

impl ChannelTransport {
    fn as_str(self) -> &'static str {
        match self {
            ChannelTransport::Local => "local",
            ChannelTransport::Unix => "unix",
            ChannelTransport::Tcp => "tcp",
        }
    }
}

impl fmt::Display for ChannelTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ChannelTransport {
    /// The names [`ChannelTransport`]'s `FromStr` accepts, as its error lists them.
    pub const NAMES: &'static str = "\"local\", \"unix\" (or \"ipc\") or \"tcp\"";
}

/// Parses a transport name: `"local"`, `"unix"` (or its alias `"ipc"`) or `"tcp"`,
/// the one parser of transport names (the Python bindings use it too).
///
/// ```
/// use hyperactor::ChannelTransport;
///
/// assert_eq!("ipc".parse::<ChannelTransport>().unwrap(), ChannelTransport::Unix);
/// let err = "udp".parse::<ChannelTransport>().unwrap_err().to_string();
/// assert!(err.contains(ChannelTransport::NAMES), "{err}");
/// ```
impl FromStr for ChannelTransport {
    type Err = ChannelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "local" => Ok(ChannelTransport::Local),
            "unix" | "ipc" => Ok(ChannelTransport::Unix),
            "tcp" => Ok(ChannelTransport::Tcp),
            _ => Err(ChannelError::UnknownTransport {
                input: s.to_string(),
            }),
        }
    }
}

/// The address of a channel endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChannelAddr {
    /// An in-process endpoint; `Local(0)` asks `serve` for a fresh id.
    Local(u64),
    /// A Unix domain socket path.
    Unix(PathBuf),
    /// A TCP socket address; port 0 asks `serve` for a free port.
    Tcp(SocketAddr),
}

/// Where an endpoint listens: an address to bind, or a TCP socket bound and listening
/// already, inherited from the parent process (socket activation: the parent binds, e.g.
/// port 0, and passes the descriptor). Only for serving: nothing dials a `Listen`.
///
/// ```
/// use hyperactor::channel::{ChannelAddr, Listen};
/// let bind: Listen = "tcp:127.0.0.1:0".parse::<ChannelAddr>().unwrap().into();
/// assert_eq!(bind.to_string(), "tcp:127.0.0.1:0");
/// assert_eq!(Listen::InheritedFd(3).to_string(), "the inherited file descriptor 3");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Listen {
    /// Bind this address.
    Addr(ChannelAddr),
    /// Adopt the listening TCP socket open in this process as this file descriptor
    /// (served with [`crate::channel::serve_listen_with`], which checks it).
    InheritedFd(i32),
}

impl From<ChannelAddr> for Listen {
    fn from(addr: ChannelAddr) -> Self {
        Listen::Addr(addr)
    }
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Addr(addr) => addr.fmt(f),
            Listen::InheritedFd(fd) => write!(f, "the inherited file descriptor {fd}"),
        }
    }
}

const EXPECTED_ADDR: &str =
    "\"local:<u64>\", \"unix:<path>\", \"tcp:<ipv4>:<port>\" or \"tcp:[<ipv6>]:<port>\"";

impl ChannelAddr {
    /// An address that [`crate::channel::serve`] binds to a fresh endpoint:
    /// `Local(0)`, a unique socket path in the per-user
    /// [`socket_dir`](crate::channel::socket_dir) (which `serve` creates,
    /// private to this user), or `127.0.0.1:0`.
    pub fn any(transport: ChannelTransport) -> ChannelAddr {
        match transport {
            ChannelTransport::Local => ChannelAddr::Local(0),
            ChannelTransport::Unix => ChannelAddr::Unix(unique_socket_path()),
            ChannelTransport::Tcp => {
                ChannelAddr::Tcp(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0))
            }
        }
    }

    /// The transport this address uses.
    pub fn transport(&self) -> ChannelTransport {
        match self {
            ChannelAddr::Local(_) => ChannelTransport::Local,
            ChannelAddr::Unix(_) => ChannelTransport::Unix,
            ChannelAddr::Tcp(_) => ChannelTransport::Tcp,
        }
    }
}

/// The address to tell peers for an endpoint bound at `bound`: `advertise` when given
/// (its port 0 replaced by the bound port); else, for a TCP endpoint bound to every
/// interface (`0.0.0.0` or `::`), the bound port at this machine's
/// [`primary_ip`] (never a loopback address, which would name the peer's own
/// machine); else `bound` itself.
pub fn advertised(bound: &ChannelAddr, advertise: Option<&ChannelAddr>) -> ChannelAddr {
    match (bound, advertise) {
        (ChannelAddr::Tcp(b), Some(ChannelAddr::Tcp(a))) if a.port() == 0 => {
            ChannelAddr::Tcp(SocketAddr::new(a.ip(), b.port()))
        }
        (_, Some(a)) => a.clone(),
        (ChannelAddr::Tcp(b), None) if b.ip().is_unspecified() => match primary_ip() {
            Some(ip) => ChannelAddr::Tcp(SocketAddr::new(ip, b.port())),
            None => ChannelAddr::Tcp(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), b.port())),
        },
        (b, None) => b.clone(),
    }
}

/// This machine's main IP address for peers on other machines: the IPv4 address of
/// the first interface that is up and is not a loopback (in the order the kernel lists
/// them), else such an IPv6 address (not link-local), else `None`.
pub fn primary_ip() -> Option<std::net::IpAddr> {
    let mut v4 = None;
    let mut v6 = None;
    let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `addrs` with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut addrs) } != 0 {
        return None;
    }
    let mut cur = addrs;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        let up = ifa.ifa_flags & (libc::IFF_UP as u32) != 0;
        let loopback = ifa.ifa_flags & (libc::IFF_LOOPBACK as u32) != 0;
        if !up || loopback || ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to a sockaddr of the family it names.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        if family == libc::AF_INET && v4.is_none() {
            // SAFETY: the family is AF_INET, so this is a sockaddr_in.
            let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            if !ip.is_loopback() && !ip.is_unspecified() {
                v4 = Some(ip);
            }
        } else if family == libc::AF_INET6 && v6.is_none() {
            // SAFETY: the family is AF_INET6, so this is a sockaddr_in6.
            let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let link_local = (ip.segments()[0] & 0xffc0) == 0xfe80;
            if !ip.is_loopback() && !ip.is_unspecified() && !link_local {
                v6 = Some(ip);
            }
        }
    }
    // SAFETY: `addrs` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(addrs) };
    v4.map(std::net::IpAddr::V4)
        .or(v6.map(std::net::IpAddr::V6))
}

/// A socket path in [`socket_dir`] unique to this process and call (pid,
/// counter, clock), with a file name of about 25 bytes.
fn unique_socket_path() -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    socket_dir().join(format!("{}-{n}-{nanos:x}.sock", std::process::id()))
}

impl fmt::Display for ChannelAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChannelAddr::Local(id) => write!(f, "local:{id}"),
            ChannelAddr::Unix(path) => write!(f, "unix:{}", path.display()),
            ChannelAddr::Tcp(addr) => write!(f, "tcp:{addr}"),
        }
    }
}

impl FromStr for ChannelAddr {
    type Err = ChannelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || ChannelError::InvalidAddr {
            input: s.to_string(),
            expected: EXPECTED_ADDR,
        };
        let (transport, rest) = s.split_once(':').ok_or_else(invalid)?;
        match transport
            .parse::<ChannelTransport>()
            .map_err(|_| invalid())?
        {
            ChannelTransport::Local => {
                // Only plain decimal digits: no sign, no whitespace.
                if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(invalid());
                }
                rest.parse().map(ChannelAddr::Local).map_err(|_| invalid())
            }
            ChannelTransport::Unix if rest.is_empty() => Err(invalid()),
            ChannelTransport::Unix => Ok(ChannelAddr::Unix(PathBuf::from(rest))),
            ChannelTransport::Tcp => rest.parse().map(ChannelAddr::Tcp).map_err(|_| invalid()),
        }
    }
}

/// The compact form of an address, used by binary formats (every message header
/// carries several addresses, so formatting and parsing strings there would be
/// paid on every message). A Unix path travels as its bytes: no copy, no UTF-8
/// check when encoding.
#[derive(Serialize)]
enum CompactAddrRef<'a> {
    Local(u64),
    Unix(PathBytes<'a>),
    Tcp(std::net::SocketAddr),
}

#[derive(Deserialize)]
enum CompactAddr {
    Local(u64),
    Unix(PathBufBytes),
    Tcp(std::net::SocketAddr),
}

struct PathBytes<'a>(&'a std::path::Path);

impl Serialize for PathBytes<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use std::os::unix::ffi::OsStrExt;
        serializer.serialize_bytes(self.0.as_os_str().as_bytes())
    }
}

struct PathBufBytes(PathBuf);

impl<'de> Deserialize<'de> for PathBufBytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = PathBufBytes;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("the bytes of a Unix socket path")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<PathBufBytes, E> {
                self.visit_byte_buf(v.to_vec())
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<PathBufBytes, E> {
                use std::os::unix::ffi::OsStringExt;
                Ok(PathBufBytes(PathBuf::from(std::ffi::OsString::from_vec(v))))
            }
        }
        deserializer.deserialize_byte_buf(Visit)
    }
}

impl Serialize for ChannelAddr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            return serializer.collect_str(self);
        }
        match self {
            ChannelAddr::Local(id) => CompactAddrRef::Local(*id),
            ChannelAddr::Unix(path) => CompactAddrRef::Unix(PathBytes(path)),
            ChannelAddr::Tcp(addr) => CompactAddrRef::Tcp(*addr),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ChannelAddr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            let s = String::deserialize(deserializer)?;
            return s.parse().map_err(serde::de::Error::custom);
        }
        Ok(match CompactAddr::deserialize(deserializer)? {
            CompactAddr::Local(id) => ChannelAddr::Local(id),
            CompactAddr::Unix(PathBufBytes(path)) => ChannelAddr::Unix(path),
            CompactAddr::Tcp(addr) => ChannelAddr::Tcp(addr),
        })
    }
}
