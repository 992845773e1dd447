//! Workers: host agents started on their own (one per machine, by hand or by a
//! scheduler) that spawn procs for clients which attach to them over the network.
//!
//! A worker serves a proc whose uid is [`WORKER_UID`] at a well-known address, so a
//! client that knows only the address computes the worker's proc id
//! ([`worker_proc_id`]) and sends it spawn requests directly; nothing is exchanged
//! first. The worker's agent is a host agent (see [`crate::host`]); the procs it spawns
//! serve at the worker's advertised IP ([`crate::bootstrap::BootInfo::serve_near_host`])
//! and are reached directly by the client and by one another.
//!
//! Clients keep their procs alive with heartbeats: a client that goes away loses its
//! procs when its lease runs out, and the worker serves the next client (see
//! [`crate::agent::liveness`]). TCP connections are authenticated before any frame is
//! read ([`hyperactor::channel::auth`]).
//!
//! Every worker is also a *gateway* ([`Proc::serve_gateway`]): a client whose network
//! reaches this one address only (a laptop, a notebook, a `kubectl port-forward` of the
//! worker's port) attaches to it ([`Proc::attach`]) and drives every proc of the job
//! through it; the worker's port doubles as the attachment address, as upstream
//! Monarch's does.
//!
//! Addresses ([`parse_endpoint`]): `tcp://HOST:PORT` (HOST a name, an IPv4 address or an
//! `[IPv6]` address), `ipc://PATH` (a Unix socket, for workers on the client's machine),
//! or this crate's own forms `tcp:IP:PORT` and `unix:PATH`. A worker address may be
//! `ADVERTISE@BIND`: bind one address, tell peers another. For serving only, the port
//! may be `fdN` (`tcp://HOST:fdN`, socket activation): the worker adopts the listening
//! TCP socket it inherited as file descriptor N (its parent bound it, say to port 0,
//! and passed it) and advertises the socket's real port at HOST; clients dial that
//! port ([`parse_url`] refuses `fdN`).
//!
//! ```no_run
//! use hyperactor_mesh::agent::AgentOptions;
//! use hyperactor_mesh::worker::{serve_worker, worker_proc_id, WorkerAddress};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let address = WorkerAddress::parse("tcp://0.0.0.0:26600")?;
//! let agent = serve_worker(&address, AgentOptions::default(), std::time::Duration::from_secs(30)).await?;
//! // Clients reach it as:
//! println!("{}", worker_proc_id(agent.proc().proc_id().addr()));
//! # Ok(())
//! # }
//! ```

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use hyperactor::channel::Listen;
use hyperactor::{ChannelAddr, Proc, ProcId};

use crate::agent::{AgentOptions, ProcAgent};
use crate::error::MeshError;
use crate::host::Host;

/// The uid of every worker's proc.
pub const WORKER_UID: &str = "worker";

/// The proc id of the worker serving at `addr` (its advertised address).
// invariant: WORKER_UID is a valid name.
#[allow(clippy::expect_used)]
pub fn worker_proc_id(addr: &ChannelAddr) -> ProcId {
    ProcId::new(WORKER_UID, addr.clone()).expect("invariant: WORKER_UID is a valid name")
}

fn bad(input: &str, reason: impl std::fmt::Display) -> MeshError {
    MeshError::InvalidAddress {
        input: input.to_string(),
        reason: reason.to_string(),
    }
}

/// One address as written (see the [module docs](self)), its host name resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A channel address, to dial or to bind.
    Addr(ChannelAddr),
    /// `tcp://HOST:fdN`: the listening TCP socket this process inherited as file
    /// descriptor `fd`, advertised at `host` with the socket's real port. Only for
    /// serving.
    InheritedFd {
        /// HOST, resolved (unspecified for `0.0.0.0` or `[::]`: derived from the
        /// socket's address, as for a bound address).
        host: IpAddr,
        /// Whether HOST was given as a name rather than an IP address.
        named: bool,
        /// The descriptor.
        fd: i32,
    },
}

/// The port part of a TCP address: a number, or `fdN`.
enum Port {
    Number(u16),
    InheritedFd(i32),
}

fn parse_port(input: &str, port: &str) -> Result<Port, MeshError> {
    if let Some(digits) = port.strip_prefix("fd") {
        let number = digits
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| digits.parse::<i32>().ok())
            .flatten();
        return match number {
            Some(fd) => Ok(Port::InheritedFd(fd)),
            None => Err(bad(
                input,
                format!(
                    "{port:?} is not a file descriptor: expected fdN with N the number of a \
                     listening socket this process inherited (for example fd3)"
                ),
            )),
        };
    }
    port.parse().map(Port::Number).map_err(|e| {
        bad(
            input,
            format!(
                "the port {port:?} is not a number: {e} (expected a port 0-65535, or, to \
                 serve on a listening socket this process inherited, fdN)"
            ),
        )
    })
}

/// Parses one address (see the [module docs](self)), resolving a host name: the one
/// parser of the textual address forms, for [`parse_url`] (dialing) and
/// [`WorkerAddress::parse`] (serving).
///
/// # Errors
///
/// [`MeshError::InvalidAddress`] saying what is wrong and what is expected.
pub fn parse_endpoint(input: &str) -> Result<Endpoint, MeshError> {
    let text = input.trim();
    if let Some(path) = text
        .strip_prefix("ipc://")
        .or_else(|| text.strip_prefix("unix:"))
    {
        if path.is_empty() {
            return Err(bad(input, "the socket path is empty"));
        }
        return Ok(Endpoint::Addr(ChannelAddr::Unix(PathBuf::from(path))));
    }
    let hostport = if let Some(rest) = text.strip_prefix("tcp://") {
        rest
    } else if let Some(rest) = text.strip_prefix("tcp:") {
        rest
    } else if text.starts_with("metatls://") || text.starts_with("tls://") {
        return Err(bad(
            input,
            "TLS transports are not supported yet; use tcp:// (connections are \
             authenticated with the cluster secret)",
        ));
    } else {
        return Err(bad(
            input,
            "expected tcp://HOST:PORT or ipc://PATH (optionally ADVERTISE@BIND)",
        ));
    };
    let (host, port) = hostport
        .rsplit_once(':')
        .ok_or_else(|| bad(input, "the port is missing (tcp://HOST:PORT)"))?;
    if host == "*" {
        return Err(bad(
            input,
            "tcp://* is not accepted: give the address to bind (tcp://0.0.0.0:PORT binds \
             every interface and advertises this machine's primary IP)",
        ));
    }
    let port = parse_port(input, port)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let (ip, named) = match host.parse::<IpAddr>() {
        Ok(ip) => (ip, false),
        Err(_) => (resolve(input, host)?, true),
    };
    Ok(match port {
        Port::Number(port) => Endpoint::Addr(ChannelAddr::Tcp(SocketAddr::new(ip, port))),
        Port::InheritedFd(fd) => Endpoint::InheritedFd {
            host: ip,
            named,
            fd,
        },
    })
}

/// The address of host name `host` (an IPv4 one when there is one).
fn resolve(input: &str, host: &str) -> Result<IpAddr, MeshError> {
    let resolved: Vec<SocketAddr> = (host, 0)
        .to_socket_addrs()
        .map_err(|e| bad(input, format!("cannot resolve host name {host:?}: {e}")))?
        .collect();
    let pick = resolved
        .iter()
        .find(|a| a.is_ipv4())
        .or(resolved.first())
        .ok_or_else(|| bad(input, format!("host name {host:?} resolves to no address")))?;
    Ok(pick.ip())
}

/// Parses one address to dial (see the [module docs](self)), resolving a host name.
///
/// # Errors
///
/// [`MeshError::InvalidAddress`] saying what is wrong and what is expected; for
/// `tcp://HOST:fdN`, which only a worker serving on that inherited socket uses.
pub fn parse_url(input: &str) -> Result<ChannelAddr, MeshError> {
    match parse_endpoint(input)? {
        Endpoint::Addr(addr) => Ok(addr),
        Endpoint::InheritedFd { fd, .. } => Err(bad(
            input,
            format!(
                "fd{fd} names a listening socket a worker inherited (socket activation): it \
                 is only for serving (run_worker_loop_forever, monarch worker --address); \
                 dial the worker at the socket's real port, tcp://HOST:PORT (the worker \
                 prints it in its ready line)"
            ),
        )),
    }
}

/// Where a worker listens, and what it tells peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerAddress {
    /// The address bound, or the inherited listening socket served.
    pub bind: Listen,
    /// The address peers dial, when it differs from the bound one (a TCP port 0 stands
    /// for the bound port).
    pub advertise: Option<ChannelAddr>,
}

impl WorkerAddress {
    /// Parses `ADDRESS` or `ADVERTISE@BIND` (see the [module docs](self)). A host name
    /// that resolves to a loopback address (as many machines map their own name to
    /// 127.0.1.1) binds every interface and advertises this machine's primary IP
    /// instead, since a loopback address names each peer's own machine.
    ///
    /// # Errors
    ///
    /// [`MeshError::InvalidAddress`] for an address that does not parse or resolve.
    pub fn parse(input: &str) -> Result<Self, MeshError> {
        let (advertise, bind) = match input.split_once('@') {
            Some((advertise, bind)) => (Some(parse_url(advertise)?), parse_endpoint(bind)?),
            None => (None, parse_endpoint(input)?),
        };
        let bind = match bind {
            Endpoint::Addr(addr) => addr,
            Endpoint::InheritedFd { host, named, fd } => {
                // HOST as given, with the socket's real port (0 stands for it); an
                // unspecified HOST, or a name of this machine's loopback, is derived
                // from the socket's own address instead.
                let advertise = advertise.or_else(|| {
                    if host.is_unspecified() {
                        return None;
                    }
                    if named && host.is_loopback() {
                        tracing::warn!(
                            "worker address {input:?} resolves to the loopback address {host}, \
                             which other machines cannot reach: advertising the inherited \
                             socket's own address instead"
                        );
                        return None;
                    }
                    Some(ChannelAddr::Tcp(SocketAddr::new(host, 0)))
                });
                return Ok(Self {
                    bind: Listen::InheritedFd(fd),
                    advertise,
                });
            }
        };
        if advertise.is_none() {
            if let ChannelAddr::Tcp(sock) = &bind {
                let named = !input.contains("127.")
                    && !input.contains("localhost")
                    && !input.contains("[::1]");
                if sock.ip().is_loopback() && named {
                    let any = SocketAddr::new(IpAddr::from([0, 0, 0, 0]), sock.port());
                    tracing::warn!(
                        "worker address {input:?} resolves to the loopback address {}, which \
                         other machines cannot reach: binding {any} and advertising this \
                         machine's primary IP",
                        sock.ip()
                    );
                    return Ok(Self {
                        bind: Listen::Addr(ChannelAddr::Tcp(any)),
                        advertise: None,
                    });
                }
            }
        }
        Ok(Self {
            bind: Listen::Addr(bind),
            advertise,
        })
    }

    /// The address clients dial for a worker given as `input` (its advertised part).
    ///
    /// # Errors
    ///
    /// As [`parse_url`] (an `fdN` address is refused: it only serves).
    pub fn dial(input: &str) -> Result<ChannelAddr, MeshError> {
        let advertised = input.split_once('@').map_or(input, |(a, _)| a);
        parse_url(advertised)
    }
}

/// Serves a worker's proc (uid [`WORKER_UID`], a gateway) at `address` and its host,
/// which waits `ready_timeout` for each spawn's procs to report ready. [`serve_worker`]
/// adds the agent; bindings that set up their agent themselves start here.
///
/// # Errors
///
/// [`MeshError::SpawnProcs`] if the address cannot be served (in use, not an address
/// of this machine, ...), naming it.
///
/// # Cancel safety
///
/// Cancel safe: nothing stays served.
pub async fn worker_host(
    address: &WorkerAddress,
    ready_timeout: Duration,
) -> Result<Host, MeshError> {
    let failed = |reason: String| MeshError::SpawnProcs {
        name: WORKER_UID.to_string(),
        reason,
    };
    let proc = Proc::serve_gateway(&address.bind, address.advertise.as_ref(), WORKER_UID)
        .await
        .map_err(|e| match &address.bind {
            Listen::Addr(addr) => failed(format!("cannot serve a worker at {addr}: {e}")),
            // The error names the descriptor and what is wrong with it.
            Listen::InheritedFd(_) => failed(format!("cannot serve a worker: {e}")),
        })?;
    Ok(Host::new(proc)
        .map_err(|e| failed(e.to_string()))?
        .with_ready_timeout(ready_timeout))
}

/// Serves a worker at `address`: its proc (uid [`WORKER_UID`]), host and host agent
/// (see [`worker_host`]).
///
/// # Errors
///
/// As [`worker_host`] and [`ProcAgent::new`].
///
/// # Cancel safety
///
/// Cancel safe: nothing stays served.
pub async fn serve_worker(
    address: &WorkerAddress,
    options: AgentOptions,
    ready_timeout: Duration,
) -> Result<ProcAgent, MeshError> {
    let host = worker_host(address, ready_timeout).await?;
    ProcAgent::new(host.proc().clone(), options.host(host))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_to_channel_addresses() {
        assert_eq!(
            parse_url("tcp://10.0.0.2:26600").unwrap().to_string(),
            "tcp:10.0.0.2:26600"
        );
        assert_eq!(
            parse_url("tcp://[::1]:7").unwrap().to_string(),
            "tcp:[::1]:7"
        );
        assert_eq!(
            parse_url("ipc:///tmp/w.sock").unwrap().to_string(),
            "unix:/tmp/w.sock"
        );
        assert_eq!(
            parse_url("tcp:127.0.0.1:9").unwrap().to_string(),
            "tcp:127.0.0.1:9"
        );
        assert!(matches!(
            parse_url("tcp://localhost:9").unwrap(),
            ChannelAddr::Tcp(a) if a.port() == 9
        ));
    }

    #[test]
    fn bad_urls_say_what_is_expected() {
        for (input, needle) in [
            ("tcp://*:9", "tcp://* is not accepted"),
            ("tcp://10.0.0.1", "port is missing"),
            ("tcp://10.0.0.1:x", "not a number"),
            ("http://x:1", "expected tcp://"),
            ("metatls://x:1", "not supported"),
            ("ipc://", "empty"),
            ("tcp://no-such-host.invalid:1", "cannot resolve"),
        ] {
            let err = parse_url(input).unwrap_err().to_string();
            assert!(err.contains(needle), "{input}: {err}");
            assert!(err.contains(input), "{input}: {err}");
        }
    }

    #[test]
    fn advertise_at_bind_splits() {
        let a = WorkerAddress::parse("tcp://10.1.2.3:5@tcp://0.0.0.0:5").unwrap();
        assert_eq!(a.bind.to_string(), "tcp:0.0.0.0:5");
        assert_eq!(a.advertise.unwrap().to_string(), "tcp:10.1.2.3:5");
        assert_eq!(
            WorkerAddress::dial("tcp://10.1.2.3:5@tcp://0.0.0.0:5")
                .unwrap()
                .to_string(),
            "tcp:10.1.2.3:5"
        );
        let local = WorkerAddress::parse("tcp://127.0.0.1:5").unwrap();
        assert_eq!(local.bind.to_string(), "tcp:127.0.0.1:5");
    }

    #[test]
    fn an_inherited_descriptor_is_a_typed_bind_never_dialed() {
        assert_eq!(
            parse_endpoint("tcp://127.0.0.1:fd3").unwrap(),
            Endpoint::InheritedFd {
                host: IpAddr::from([127, 0, 0, 1]),
                named: false,
                fd: 3,
            }
        );
        // HOST as given, with the socket's real port (0 stands for it).
        let a = WorkerAddress::parse("tcp://127.0.0.1:fd3").unwrap();
        assert_eq!(a.bind, Listen::InheritedFd(3));
        assert_eq!(a.advertise.unwrap().to_string(), "tcp:127.0.0.1:0");
        // Every interface: derived from the socket, as for a bound address.
        let any = WorkerAddress::parse("tcp://0.0.0.0:fd4").unwrap();
        assert_eq!((any.bind, any.advertise), (Listen::InheritedFd(4), None));
        let split = WorkerAddress::parse("tcp://10.1.2.3:0@tcp://0.0.0.0:fd5").unwrap();
        assert_eq!(split.bind, Listen::InheritedFd(5));
        assert_eq!(split.advertise.unwrap().to_string(), "tcp:10.1.2.3:0");
        // Only for serving: dialing it is an error that says what to dial.
        for input in [
            "tcp://127.0.0.1:fd3",
            "tcp://127.0.0.1:fd3@tcp://0.0.0.0:fd3",
        ] {
            let err = WorkerAddress::dial(input).unwrap_err().to_string();
            assert!(
                err.contains("only for serving") && err.contains("tcp://HOST:PORT"),
                "{input}: {err}"
            );
        }
        for input in [
            "tcp://127.0.0.1:fd",
            "tcp://127.0.0.1:fdx",
            "tcp://127.0.0.1:fd-1",
        ] {
            let err = parse_endpoint(input).unwrap_err().to_string();
            assert!(err.contains("is not a file descriptor"), "{input}: {err}");
        }
        let err = parse_url("tcp://127.0.0.1:x3").unwrap_err().to_string();
        assert!(err.contains("fdN"), "{err}");
    }

    /// A worker serves on a listening socket it inherited, reached at its real port.
    #[tokio::test]
    async fn a_worker_serves_on_an_inherited_socket_at_its_real_port() {
        use std::os::fd::IntoRawFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let fd = listener.into_raw_fd();
        let address = WorkerAddress::parse(&format!("tcp://127.0.0.1:fd{fd}")).unwrap();
        let worker = serve_worker(&address, AgentOptions::default(), Duration::from_secs(5))
            .await
            .unwrap();
        let dialed = WorkerAddress::dial(&format!("tcp://127.0.0.1:{port}")).unwrap();
        assert_eq!(worker.proc().proc_id(), &worker_proc_id(&dialed));
        let client = client_agent(AgentOptions::default()).await;
        tokio::time::timeout(
            Duration::from_secs(10),
            client.probe(&worker_proc_id(&dialed), Duration::from_secs(5)),
        )
        .await
        .unwrap()
        .unwrap();
    }

    /// A worker on a free loopback port.
    async fn loopback_worker(options: AgentOptions) -> ProcAgent {
        let address = WorkerAddress::parse("tcp://127.0.0.1:0").unwrap();
        serve_worker(&address, options, Duration::from_secs(5))
            .await
            .unwrap()
    }

    /// A client agent on a Unix socket.
    async fn client_agent(options: AgentOptions) -> ProcAgent {
        ProcAgent::serve(hyperactor::ChannelTransport::Unix, "client", options)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_worker_is_reached_by_its_well_known_id() {
        let worker = loopback_worker(AgentOptions::default()).await;
        let id = worker_proc_id(worker.proc().proc_id().addr());
        assert_eq!(&id, worker.proc().proc_id());
        let client = client_agent(AgentOptions::default()).await;
        tokio::time::timeout(
            Duration::from_secs(10),
            client.probe(&id, Duration::from_secs(5)),
        )
        .await
        .unwrap()
        .unwrap();
        // A worker nobody serves: refused at once, with the reason.
        let gone = worker_proc_id(&"tcp:127.0.0.1:1".parse().unwrap());
        let err = tokio::time::timeout(
            Duration::from_secs(10),
            client.probe(&gone, Duration::from_secs(5)),
        )
        .await
        .unwrap()
        .unwrap_err()
        .to_string();
        assert!(err.contains("refused") || err.contains("connect"), "{err}");
    }

    /// A loopback worker, and a client with fast heartbeats that monitors it and owns
    /// one proc on it (mesh id 7): the worker, its host id, the client, the proc.
    async fn monitored_worker_with_a_proc() -> (ProcAgent, ProcId, ProcAgent, ProcId) {
        let worker = loopback_worker(AgentOptions::default()).await;
        let host = worker.proc().proc_id().clone();
        let client = client_agent(AgentOptions::default().liveness(fast_liveness())).await;
        let proc: ProcId = "p-1@tcp:127.0.0.1:1".parse().unwrap();
        let info = crate::cast::codec::MeshInfo {
            id: 7,
            name: "procs".into(),
            class: "proc".into(),
        };
        let owner = hyperactor::SendContext::actor_id(client.client()).clone();
        client.register_owned_procs(
            info,
            owner,
            &[crate::agent::ProcInfo {
                rank: 0,
                proc_id: proc.clone(),
                pid: 0,
                host: Some(host.clone()),
            }],
        );
        client.probe(&host, Duration::from_secs(5)).await.unwrap();
        client.monitor_host(&host);
        (worker, host, client, proc)
    }

    /// Heartbeats every 20 ms; a host silent for 500 ms is lost.
    fn fast_liveness() -> crate::agent::Liveness {
        crate::agent::Liveness {
            interval: Duration::from_millis(20),
            timeout: Duration::from_millis(500),
            lease: Duration::from_secs(10),
            ..crate::agent::Liveness::default()
        }
    }

    /// LIVE-1: a worker that goes away fails the procs of it that a client knows of,
    /// naming the host.
    #[tokio::test]
    async fn a_lost_worker_fails_its_procs() {
        let (worker, host, client, proc) = monitored_worker_with_a_proc().await;
        assert!(client.death_of(&proc).is_none());
        worker.proc().stop(Duration::from_secs(1)).await;
        drop(worker);
        let death = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(death) = client.death_of(&proc) {
                    return death;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the lost worker's proc was not failed");
        let text = death.to_string();
        assert!(
            text.contains("was lost") && text.contains(&host.to_string()),
            "{text}"
        );
    }

    /// LIVE-3: once a worker is found lost, stopping procs there and ending it do not
    /// wait for it (here they would wait 10 s and 32 s).
    #[tokio::test]
    async fn a_lost_worker_is_not_waited_on() {
        let (worker, host, client, proc) = monitored_worker_with_a_proc().await;
        worker.proc().stop(Duration::from_secs(1)).await;
        drop(worker);
        tokio::time::timeout(Duration::from_secs(10), async {
            while client.death_of(&proc).is_none() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the lost worker's proc was not failed");
        let start = std::time::Instant::now();
        assert!(client.stop_owned(7, "test over").await);
        let err = client
            .end_host(&host, "test over", Duration::from_secs(30))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("lost already"), "{err}");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "waited {:?} on a lost host",
            start.elapsed()
        );
    }

    /// LIVE-3: a host that stops answering holds an end up only until heartbeats find
    /// it lost (here a socket that accepts connections and never answers).
    #[tokio::test]
    async fn a_silent_host_is_waited_on_until_it_is_found_lost() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let silent = tokio::spawn(async move {
            // Holds the connections open, answering nothing.
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let host = worker_proc_id(&format!("tcp:127.0.0.1:{port}").parse().unwrap());
        let client = client_agent(AgentOptions::default().liveness(fast_liveness())).await;
        let start = std::time::Instant::now();
        let err = tokio::time::timeout(
            Duration::from_secs(20),
            client.end_host(&host, "test over", Duration::from_secs(30)),
        )
        .await
        .expect("end_host waited on a silent host")
        .unwrap_err()
        .to_string();
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "waited {:?} on a silent host: {err}",
            start.elapsed()
        );
        assert!(err.contains("it was lost"), "{err}");
        silent.abort();
    }

    /// A client ends a worker: its end hook runs (after its procs were stopped) and the
    /// client is answered; a host agent that is not a worker refuses, naming itself.
    #[tokio::test]
    async fn a_client_ends_a_worker_and_a_plain_host_refuses() {
        let (ended_tx, ended_rx) = std::sync::mpsc::channel::<String>();
        let ended_tx = hyperactor::sync::Mutex::new(ended_tx);
        let on_end: crate::agent::EndHook = std::sync::Arc::new(move |reason: &str| {
            let _ = ended_tx.lock().send(reason.to_string());
        });
        let worker = loopback_worker(AgentOptions::default().on_end(on_end)).await;
        let host = worker.proc().proc_id().clone();
        let client = client_agent(AgentOptions::default()).await;
        tokio::time::timeout(
            Duration::from_secs(10),
            client.end_host(&host, "test over", Duration::from_secs(1)),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(
            ended_rx.recv_timeout(Duration::from_secs(10)).unwrap(),
            "test over"
        );

        let plain = loopback_worker(AgentOptions::default()).await;
        let plain_host = plain.proc().proc_id().clone();
        let err = tokio::time::timeout(
            Duration::from_secs(10),
            client.end_host(&plain_host, "test over", Duration::from_secs(1)),
        )
        .await
        .unwrap()
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("is not a worker") && err.contains(&plain_host.to_string()),
            "{err}"
        );
    }
}
