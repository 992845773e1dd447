//! A registered buffer as a peer holds it, and the choice of backend per pair of
//! endpoints: the API for Rust users (the Python `RDMABuffer` wraps the same parts).
//!
//! [`Buffer::register`] registers memory of this process and starts what peers need
//! (the TCP transfer server, the ibverbs responder); the [`Buffer`] serializes (serde)
//! to a few dozen bytes. A peer calls [`Buffer::backend`] to learn which path it
//! would take, and [`Buffer::read_into`] / [`Buffer::write_from`] to move bytes:
//!
//! 1. [`Backend::Ibverbs`]: both sides have an RDMA device (the owner registered the
//!    memory with its device, and this process has one), unless disabled;
//! 2. [`Backend::Cma`]: the owner is on this host ([`host_key`] equal);
//! 3. [`Backend::Tcp`]: otherwise, when the [`Policy`] allows the fallback; else
//!    [`RdmaError::NoPath`] naming both sides and why.
//!
//! (On one host, cross-memory copies beat an RDMA loopback, so they come before
//! ibverbs there.)

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::RdmaError;
use crate::region::{Registry, RemoteRegion};
use crate::tcp::TcpOptions;
use crate::{cma, ibverbs, tcp};

/// Which path a transfer takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Backend {
    /// One-sided RDMA READ/WRITE over an RDMA device.
    Ibverbs,
    /// Cross-memory copies between two processes of one host.
    Cma,
    /// The owner's TCP transfer server.
    Tcp,
}

impl Backend {
    /// The name Python reports (`"ibverbs"`, `"cma"`, `"tcp"`).
    pub fn name(self) -> &'static str {
        match self {
            Backend::Ibverbs => "ibverbs",
            Backend::Cma => "cma",
            Backend::Tcp => "tcp",
        }
    }
}

/// What a transfer may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Whether the TCP path may be used between hosts (`rdma_allow_tcp_fallback`).
    pub allow_tcp: bool,
    /// Whether ibverbs is off even with a device (`rdma_disable_ibverbs`).
    pub disable_ibverbs: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            allow_tcp: true,
            disable_ibverbs: false,
        }
    }
}

/// Who counts as "this host" for cross-memory copies: the kernel's boot id, and the
/// pid and network namespaces (same pids, and how simulated hosts differ).
pub fn host_key() -> &'static str {
    static KEY: OnceLock<String> = OnceLock::new();
    KEY.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown-boot".to_owned());
        let ns = |name: &str| {
            std::fs::metadata(format!("/proc/self/ns/{name}"))
                .map(|m| m.ino().to_string())
                .unwrap_or_else(|_| "?".to_owned())
        };
        format!("{boot}/{}/{}", ns("pid"), ns("net"))
    })
}

/// A registered buffer: what a peer needs to reach it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Buffer {
    /// The registration.
    pub region: RemoteRegion,
    /// The owner's [`host_key`].
    pub host: String,
    /// The owner's TCP transfer server.
    pub server: Option<SocketAddr>,
    /// The owner's ibverbs rkey, when it registered the memory with a device.
    pub rkey: Option<u32>,
}

impl Buffer {
    /// Registers `memory` of this process in place (keeping `keepalive` until the
    /// registration ends), starts the transfer server, and registers the memory with
    /// the RDMA device when there is one (unless `policy` disables it).
    ///
    /// # Errors
    ///
    /// [`RdmaError::Empty`] for no bytes; an I/O error starting the server as
    /// [`RdmaError::Refused`].
    ///
    /// # Safety
    ///
    /// `[addr, addr + len)` must stay valid while registered (REG-1 of
    /// [`crate::region`]): pass what owns it as `keepalive`, or memory that lives for
    /// ever.
    pub unsafe fn register(
        addr: u64,
        len: usize,
        keepalive: Option<Box<dyn std::any::Any + Send + Sync>>,
        policy: Policy,
    ) -> Result<Self, RdmaError> {
        // SAFETY: forwarded from the caller.
        let region = unsafe { Registry::global().register(addr, len, keepalive) }?;
        let server = tcp::serve().map_err(|e| RdmaError::Refused {
            pid: std::process::id(),
            message: format!("cannot start the RDMA TCP transfer server: {e}"),
        })?;
        ibverbs::serve();
        // Peers in other processes reach this one's memory (Yama's ptrace_scope 1).
        let _ = cma::allow_peer_access();
        let rkey = if !policy.disable_ibverbs && ibverbs::probe().available() {
            Some(ibverbs::register_for_peer(&region)?)
        } else {
            None
        };
        Ok(Self {
            region,
            host: host_key().to_owned(),
            server: Some(server),
            rkey,
        })
    }

    /// Registers a slice that lives for the rest of the process.
    ///
    /// # Errors
    ///
    /// As [`Buffer::register`].
    pub fn register_static(memory: &'static mut [u8], policy: Policy) -> Result<Self, RdmaError> {
        // SAFETY: a 'static mutable borrow is valid for ever and nobody else holds it.
        unsafe { Self::register(memory.as_mut_ptr() as u64, memory.len(), None, policy) }
    }

    /// The buffer's size in bytes.
    pub fn len(&self) -> usize {
        self.region.len
    }

    /// Whether the buffer has no bytes (never, for a registered one).
    pub fn is_empty(&self) -> bool {
        self.region.len == 0
    }

    /// The path a transfer from this process would take.
    ///
    /// # Errors
    ///
    /// [`RdmaError::NoPath`] when the owner is on another host, neither ibverbs nor
    /// (by `policy`) TCP may be used, naming both sides and why.
    pub fn backend(&self, policy: Policy) -> Result<Backend, RdmaError> {
        choose(host_key(), self, policy, || {
            if policy.disable_ibverbs {
                (false, Some("disabled by rdma_disable_ibverbs".to_owned()))
            } else {
                let probe = ibverbs::probe();
                (probe.available(), probe.reason.clone())
            }
        })
    }

    /// Copies the whole buffer into the first [`Buffer::len`] bytes of `dst`.
    ///
    /// # Errors
    ///
    /// [`RdmaError::SizeMismatch`] if `dst` is shorter; the backend's errors.
    pub fn read_into(
        &self,
        dst: &mut [u8],
        policy: Policy,
        timeout: Option<Duration>,
    ) -> Result<Backend, RdmaError> {
        let len = self.region.len;
        if dst.len() < len {
            return Err(RdmaError::SizeMismatch {
                remote: len,
                local: dst.len(),
            });
        }
        let backend = self.backend(policy)?;
        let dst = &mut dst[..len];
        let opts = options(timeout);
        match backend {
            Backend::Cma => cma::read(&self.region, dst),
            Backend::Tcp => tcp::read(self.server_addr()?, &self.region, dst, &opts),
            Backend::Ibverbs => ibverbs::read(
                self.server_addr()?,
                &self.region,
                self.rkey.unwrap_or_default(),
                dst,
                opts.deadline,
            ),
        }?;
        Ok(backend)
    }

    /// Copies `src` into the leading bytes of the buffer.
    ///
    /// # Errors
    ///
    /// [`RdmaError::SizeMismatch`] if `src` is longer; the backend's errors.
    pub fn write_from(
        &self,
        src: &[u8],
        policy: Policy,
        timeout: Option<Duration>,
    ) -> Result<Backend, RdmaError> {
        let region = self
            .region
            .range(0, src.len())
            .map_err(|_| RdmaError::SizeMismatch {
                remote: self.region.len,
                local: src.len(),
            })?;
        let backend = self.backend(policy)?;
        let opts = options(timeout);
        match backend {
            Backend::Cma => cma::write(&region, src),
            Backend::Tcp => tcp::write(self.server_addr()?, &region, src, &opts),
            Backend::Ibverbs => ibverbs::write(
                self.server_addr()?,
                &region,
                self.rkey.unwrap_or_default(),
                src,
                opts.deadline,
            ),
        }?;
        Ok(backend)
    }

    /// Ends the registration: in this process directly, elsewhere by asking the
    /// owner's server. Returns whether it was still registered.
    ///
    /// # Errors
    ///
    /// The owner's server cannot be reached.
    pub fn drop_registration(&self) -> Result<bool, RdmaError> {
        if self.host == host_key() && self.region.pid == std::process::id() {
            // (A device registration ends with it: see ibverbs::register_for_peer.)
            return Ok(Registry::global().deregister(self.region.id));
        }
        tcp::drop_remote(self.server_addr()?, &self.region, &TcpOptions::default())
    }

    fn server_addr(&self) -> Result<SocketAddr, RdmaError> {
        self.server.ok_or_else(|| RdmaError::Refused {
            pid: self.region.pid,
            message: "the owner serves no transfers over the network".into(),
        })
    }
}

fn options(timeout: Option<Duration>) -> TcpOptions {
    TcpOptions {
        deadline: timeout.map(|t| Instant::now() + t),
        ..TcpOptions::default()
    }
}

/// The backend choice, given this side's host key and ibverbs state (`ibverbs()`
/// returns whether a device is usable here, and why not).
pub fn choose(
    local_host: &str,
    buffer: &Buffer,
    policy: Policy,
    ibverbs: impl FnOnce() -> (bool, Option<String>),
) -> Result<Backend, RdmaError> {
    if buffer.host == local_host {
        return Ok(Backend::Cma);
    }
    let (device, why_not) = ibverbs();
    if device && buffer.rkey.is_some() && !policy.disable_ibverbs {
        return Ok(Backend::Ibverbs);
    }
    if policy.allow_tcp {
        return Ok(Backend::Tcp);
    }
    let ibverbs_state = if buffer.rkey.is_none() {
        "the owner registered the buffer without an RDMA device".to_owned()
    } else {
        format!(
            "this side has no usable RDMA device ({})",
            why_not.unwrap_or_else(|| "unknown".into())
        )
    };
    Err(RdmaError::NoPath {
        local: format!("pid {} on host {local_host}", std::process::id()),
        remote: format!("pid {} on host {}", buffer.region.pid, buffer.host),
        why: format!(
            "they are on different hosts, {ibverbs_state}, and the TCP path is forbidden \
             (rdma_allow_tcp_fallback=False); allow it (MONARCH_RDMA_ALLOW_TCP_FALLBACK=1) \
             or give both hosts RDMA devices"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer(host: &str, rkey: Option<u32>) -> Buffer {
        Buffer {
            region: RemoteRegion {
                pid: 1,
                id: 1,
                addr: 0x1000,
                len: 10,
                key: 0,
                slot: 0,
            },
            host: host.into(),
            server: None,
            rkey,
        }
    }

    #[test]
    fn the_best_allowed_backend_is_chosen_and_a_missing_one_is_explained() {
        let strict = Policy {
            allow_tcp: false,
            disable_ibverbs: false,
        };
        let no_device = || (false, Some("libibverbs.so.1 is not installed".to_owned()));
        let device = || (true, None);
        let policy = Policy::default();
        assert_eq!(
            choose("a", &buffer("a", None), strict, no_device).unwrap(),
            Backend::Cma
        );
        assert_eq!(
            choose("a", &buffer("a", Some(3)), policy, device).unwrap(),
            Backend::Cma
        );
        assert_eq!(
            choose("a", &buffer("b", Some(3)), strict, device).unwrap(),
            Backend::Ibverbs
        );
        assert_eq!(
            choose("a", &buffer("b", None), policy, device).unwrap(),
            Backend::Tcp
        );
        assert_eq!(
            choose("a", &buffer("b", Some(3)), policy, no_device).unwrap(),
            Backend::Tcp
        );
        let disabled = Policy {
            disable_ibverbs: true,
            ..policy
        };
        assert_eq!(
            choose("a", &buffer("b", Some(3)), disabled, device).unwrap(),
            Backend::Tcp
        );
        let err = choose("a", &buffer("b", Some(3)), strict, no_device).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("host a") && text.contains("host b"), "{text}");
        assert!(text.contains("libibverbs.so.1 is not installed"), "{text}");
        assert!(text.contains("rdma_allow_tcp_fallback"), "{text}");
    }

    #[test]
    fn a_rust_user_registers_and_reads_over_each_path_of_this_host() {
        let memory: &'static mut [u8] = Box::leak((0..=255u8).cycle().take(5000).collect());
        let buf = Buffer::register_static(memory, Policy::default()).unwrap();
        assert_eq!(buf.len(), 5000);
        // Serialized and back, as a peer gets it: a small reference.
        let bytes = bincode::serialize(&buf).unwrap();
        assert!(bytes.len() < 200, "{} bytes", bytes.len());
        assert_eq!(bincode::deserialize::<Buffer>(&bytes).unwrap(), buf);

        let mut dst = vec![0u8; 6000];
        let backend = buf.read_into(&mut dst, Policy::default(), None).unwrap();
        assert_eq!(backend, Backend::Cma);
        assert!(dst[..5000]
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i % 256) as u8));
        assert!(dst[5000..].iter().all(|&b| b == 0));

        // The same buffer as if its owner were on another host: the TCP path.
        let elsewhere = Buffer {
            host: "another-host".into(),
            ..buf.clone()
        };
        assert_eq!(elsewhere.backend(Policy::default()).unwrap(), Backend::Tcp);
        elsewhere
            .write_from(
                &[9u8; 100],
                Policy::default(),
                Some(Duration::from_secs(30)),
            )
            .unwrap();
        let mut back = vec![0u8; 5000];
        elsewhere
            .read_into(&mut back, Policy::default(), Some(Duration::from_secs(30)))
            .unwrap();
        assert!(back[..100].iter().all(|&b| b == 9));
        assert_eq!(back[100], 100);

        let err = buf
            .write_from(&[0u8; 5001], Policy::default(), None)
            .unwrap_err();
        assert!(matches!(err, RdmaError::SizeMismatch { .. }), "{err}");
        assert!(buf.drop_registration().unwrap());
        let err = buf
            .read_into(&mut dst, Policy::default(), None)
            .unwrap_err();
        assert!(matches!(err, RdmaError::Dropped { .. }), "{err}");
        let err = elsewhere.read_into(&mut dst, Policy::default(), Some(Duration::from_secs(30)));
        assert!(matches!(err, Err(RdmaError::Dropped { .. })), "{err:?}");
    }
}
