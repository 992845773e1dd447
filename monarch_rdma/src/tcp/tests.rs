use std::io::{Read, Write};

use super::client::*;
use super::server::*;
use super::wire::*;
use super::*;

fn start() -> (SocketAddr, &'static Registry) {
    let registry: &'static Registry = Box::leak(Box::new(Registry::new()));
    let addr = serve_registry(registry, "127.0.0.1:0".parse().unwrap(), None).unwrap();
    (addr, registry)
}

/// Registers leaked memory holding `bytes`, starting `skew` bytes into its
/// allocation (to test unaligned addresses).
fn register(registry: &Registry, bytes: &[u8], skew: usize) -> RemoteRegion {
    let mut backing = vec![0u8; bytes.len() + skew];
    backing[skew..].copy_from_slice(bytes);
    let memory: &'static mut [u8] = Box::leak(backing.into_boxed_slice());
    registry.register_slice(&mut memory[skew..]).unwrap()
}

/// The registered memory's current bytes (no transfer may be in flight).
fn contents(region: &RemoteRegion) -> Vec<u8> {
    let mut copy = vec![0u8; region.len];
    // SAFETY: test regions are leaked memory, valid for ever, and no transfer to
    // them is in flight.
    unsafe {
        std::ptr::copy_nonoverlapping(
            std::ptr::with_exposed_provenance::<u8>(region.addr as usize),
            copy.as_mut_ptr(),
            region.len,
        );
    }
    copy
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

fn opts(parallelism: usize, chunk_bytes: usize) -> TcpOptions {
    TcpOptions {
        parallelism,
        chunk_bytes,
        deadline: Some(Instant::now() + Duration::from_secs(60)),
    }
}

fn pooled(server: SocketAddr) -> usize {
    POOL.lock().get(&server).map_or(0, Vec::len)
}

#[test]
fn reads_and_writes_single_bytes_odd_lengths_and_sub_ranges() {
    let (server, registry) = start();
    let o = opts(4, 64 << 20);

    let one = register(registry, &[42], 0);
    let mut byte = [0u8];
    read(server, &one, &mut byte, &o).unwrap();
    assert_eq!(byte, [42]);
    write(server, &one, &[7], &o).unwrap();
    assert_eq!(contents(&one), [7]);

    let initial = pattern(100_003, 1);
    let odd = register(registry, &initial, 3);
    assert_eq!(odd.addr % 2, 1, "unaligned start");
    let mut copy = vec![0u8; odd.len];
    read(server, &odd, &mut copy, &o).unwrap();
    assert_eq!(copy, initial);
    let fresh = pattern(odd.len, 9);
    write(server, &odd, &fresh, &o).unwrap();
    assert_eq!(contents(&odd), fresh);

    let sub = odd.range(1001, 5003).unwrap();
    let mut part = vec![0u8; sub.len];
    read(server, &sub, &mut part, &o).unwrap();
    assert_eq!(part, fresh[1001..6004]);
    let patch = pattern(sub.len, 77);
    write(server, &sub, &patch, &o).unwrap();
    let mut expected = fresh.clone();
    expected[1001..6004].copy_from_slice(&patch);
    assert_eq!(contents(&odd), expected, "only the sub-range changed");

    let mut small = vec![0u8; sub.len - 1];
    let err = read(server, &sub, &mut small, &o).unwrap_err();
    assert!(matches!(err, RdmaError::SizeMismatch { .. }), "{err}");

    // An empty sub-range moves nothing but is still checked.
    read(server, &odd.range(5, 0).unwrap(), &mut [], &o).unwrap();
    ping(server, &o).unwrap();
}

#[test]
fn multi_piece_transfers_run_over_parallel_pooled_connections() {
    let (server, registry) = start();
    let len = 20 << 20;
    let initial = pattern(len, 3);
    let region = register(registry, &initial, 0);
    let o = opts(4, 1 << 20);
    let mut copy = vec![0u8; len];
    read(server, &region, &mut copy, &o).unwrap();
    assert!(copy == initial, "read content");
    let fresh = pattern(len, 200);
    write(server, &region, &fresh, &o).unwrap();
    assert!(contents(&region) == fresh, "write content");
    let idle = pooled(server);
    assert!((1..=4).contains(&idle), "{idle} pooled connections");

    // Pieces of uneven sizes: the last one is shorter.
    let uneven = region.range(12345, (5 << 20) + 17).unwrap();
    let mut part = vec![0u8; uneven.len];
    read(server, &uneven, &mut part, &opts(3, 1 << 20)).unwrap();
    assert!(part == fresh[12345..12345 + uneven.len]);
    assert!(pooled(server) <= 4, "connections are reused");
}

#[test]
fn stale_handles_and_bad_ranges_are_refused() {
    let (server, registry) = start();
    let o = opts(2, 1 << 20);
    let region = register(registry, &pattern(4096, 5), 0);
    let mut dst = vec![0u8; 4096];

    let wrong_key = RemoteRegion {
        key: region.key ^ 1,
        ..region
    };
    let err = read(server, &wrong_key, &mut dst, &o).unwrap_err();
    assert!(
        matches!(err, RdmaError::Dropped { id, .. } if id == region.id),
        "{err}"
    );
    let err = write(server, &wrong_key, &dst, &o).unwrap_err();
    assert!(matches!(err, RdmaError::Dropped { .. }), "{err}");

    let beyond = RemoteRegion {
        len: region.len + 1,
        ..region
    };
    let err = read(server, &beyond, &mut vec![0u8; 4097], &o).unwrap_err();
    assert!(
        matches!(
            err,
            RdmaError::OutOfRange {
                offset: 0,
                len: 4097,
                size: 4096
            }
        ),
        "{err}"
    );
    let err = write(server, &beyond, &vec![1u8; 4097], &o).unwrap_err();
    assert!(matches!(err, RdmaError::OutOfRange { .. }), "{err}");
    assert_eq!(
        contents(&region),
        pattern(4096, 5),
        "a refused write writes nothing"
    );

    let below = RemoteRegion {
        addr: region.addr - 1,
        ..region
    };
    let err = read(server, &below, &mut dst, &o).unwrap_err();
    assert!(matches!(err, RdmaError::Refused { .. }), "{err}");

    // The server goes on serving after refusals.
    read(server, &region, &mut dst, &o).unwrap();
    assert_eq!(dst, pattern(4096, 5));

    assert!(!drop_remote(server, &wrong_key, &o).unwrap());
    assert!(drop_remote(server, &region.range(10, 10).unwrap(), &o).unwrap());
    assert!(!drop_remote(server, &region, &o).unwrap());
    assert_eq!(registry.get(region.id), None);
    let err = read(server, &region, &mut dst, &o).unwrap_err();
    assert!(matches!(err, RdmaError::Dropped { .. }), "{err}");
    assert!(err.to_string().contains(&region.pid.to_string()), "{err}");

    // A request naming another pid: the owner is gone, another process listens.
    let other = RemoteRegion {
        pid: region.pid + 1,
        ..region
    };
    let err = read(server, &other, &mut dst, &o).unwrap_err();
    assert!(matches!(err, RdmaError::OwnerGone { .. }), "{err}");
}

#[test]
fn control_handlers_answer_and_refuse() {
    let (server, _) = start();
    let o = opts(1, 1 << 20);
    let pid = std::process::id();
    set_control_handler(
        200,
        Box::new(|payload| Ok(payload.iter().rev().copied().collect())),
    );
    set_control_handler(
        201,
        Box::new(|payload| Err(format!("cannot handle {} bytes", payload.len()))),
    );
    set_control_handler(202, Box::new(|_| panic!("handler bug")));
    set_control_handler(3, Box::new(|_| Ok(b"reserved".to_vec())));

    assert_eq!(request(server, pid, 200, b"abc", &o).unwrap(), b"cba");
    assert_eq!(request(server, pid, 200, b"", &o).unwrap(), b"");
    let big = pattern(3 << 20, 4);
    let answer = request(server, pid, 200, &big, &o).unwrap();
    assert!(answer.iter().rev().eq(big.iter()));

    let err = request(server, pid, 201, b"xy", &o).unwrap_err();
    assert!(
        matches!(&err, RdmaError::Refused { message, .. } if message == "cannot handle 2 bytes"),
        "{err}"
    );
    let err = request(server, pid, 202, b"", &o).unwrap_err();
    assert!(err.to_string().contains("handler bug"), "{err}");
    let err = request(server, pid, 203, b"", &o).unwrap_err();
    assert!(err.to_string().contains("no handler"), "{err}");
    let err = request(server, pid, 3, b"", &o).unwrap_err();
    assert!(
        err.to_string().contains("no handler"),
        "reserved kinds: {err}"
    );
    let err = request(server, pid, 200, &vec![0u8; MAX_CONTROL_BYTES + 1], &o).unwrap_err();
    assert!(matches!(err, RdmaError::Refused { .. }), "{err}");
    // Still serving.
    assert_eq!(request(server, pid, 200, b"ok", &o).unwrap(), b"ko");
}

#[test]
fn an_address_without_a_listener_is_unreachable() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = listener.local_addr().unwrap();
    drop(listener);
    let region = RemoteRegion {
        pid: 4242,
        id: 1,
        addr: 0x1000,
        len: 10,
        key: 1,
        slot: 0,
    };
    let started = Instant::now();
    let err = read(server, &region, &mut [0u8; 10], &opts(4, 1 << 20)).unwrap_err();
    assert!(matches!(err, RdmaError::Unreachable { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("4242") && message.contains(&server.to_string()),
        "{message}"
    );
    let err = request(server, 4242, 100, b"", &TcpOptions::default()).unwrap_err();
    assert!(matches!(err, RdmaError::Unreachable { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_server_that_never_answers_times_out() {
    // The kernel accepts connections into the backlog; nobody ever answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = listener.local_addr().unwrap();
    let region = RemoteRegion {
        pid: 4243,
        id: 1,
        addr: 0x1000,
        len: 3 << 20,
        key: 1,
        slot: 0,
    };
    let budget = Duration::from_millis(300);
    for parallelism in [1, 3] {
        let o = TcpOptions {
            parallelism,
            chunk_bytes: 1 << 20,
            deadline: Some(Instant::now() + budget),
        };
        let started = Instant::now();
        let err = read(server, &region, &mut vec![0u8; region.len], &o).unwrap_err();
        assert!(
            matches!(err, RdmaError::Timeout { pid: 4243, seconds } if (0.2..=0.3).contains(&seconds)),
            "{err}"
        );
        let elapsed = started.elapsed();
        assert!(
            elapsed >= budget && elapsed < Duration::from_secs(5),
            "{elapsed:?}"
        );
    }
    // A write larger than the socket buffers blocks in sending, and times out too.
    let o = TcpOptions {
        deadline: Some(Instant::now() + budget),
        ..opts(1, 64 << 20)
    };
    let big = RemoteRegion {
        len: 64 << 20,
        ..region
    };
    let err = write(server, &big, &vec![0u8; big.len], &o).unwrap_err();
    assert!(matches!(err, RdmaError::Timeout { .. }), "{err}");
    let err = request(server, 4243, 100, b"x", &o).unwrap_err();
    assert!(
        matches!(err, RdmaError::Timeout { .. }),
        "an expired deadline: {err}"
    );
    drop(listener);
}

/// A fake server: accepts one connection and runs `script` on it.
fn fake_server(
    script: impl FnOnce(TcpStream) + Send + 'static,
) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let thread = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        script(stream);
    });
    (addr, thread)
}

#[test]
fn a_connection_that_breaks_mid_transfer_is_unreachable() {
    let len = 1 << 20;
    let (server, thread) = fake_server(move |mut stream| {
        let mut head = [0u8; REQUEST_BYTES];
        stream.read_exact(&mut head).unwrap();
        let request = Request::decode(&head).unwrap();
        assert_eq!((request.op, request.len), (OP_READ, len as u64));
        let reply = Reply {
            status: OK,
            len: request.len,
        };
        stream.write_all(&reply.encode()).unwrap();
        stream.write_all(&vec![1u8; len / 2]).unwrap();
        // Dies: the connection closes half-way.
    });
    let region = RemoteRegion {
        pid: 4244,
        id: 1,
        addr: 0x1000,
        len,
        key: 1,
        slot: 0,
    };
    let err = read(server, &region, &mut vec![0u8; len], &opts(1, len)).unwrap_err();
    assert!(matches!(err, RdmaError::Unreachable { .. }), "{err}");
    thread.join().unwrap();
    assert_eq!(pooled(server), 0, "a broken connection is not pooled");
}

#[test]
fn a_pooled_connection_closed_by_the_server_is_retried_on_a_new_one() {
    let (server, registry) = start();
    let region = register(registry, &pattern(1000, 8), 0);
    // A connection that looks idle and open, but whose peer closes it as soon as
    // a request arrives, without answering.
    let (fake, thread) = fake_server(|mut stream| {
        let mut head = [0u8; REQUEST_BYTES];
        let _ = stream.read_exact(&mut head);
    });
    let stale = TcpStream::connect(fake).unwrap();
    checkin(server, stale);
    let mut dst = vec![0u8; 1000];
    read(server, &region, &mut dst, &opts(1, 1 << 20)).unwrap();
    assert_eq!(dst, pattern(1000, 8));
    thread.join().unwrap();
    // A pooled connection already closed is skipped without a request.
    let (fake, thread) = fake_server(|_| {});
    let closed = TcpStream::connect(fake).unwrap();
    thread.join().unwrap();
    checkin(server, closed);
    assert!(drop_remote(server, &region, &opts(1, 1 << 20)).unwrap());
}

#[test]
fn memory_freed_or_protected_behind_the_registry_is_refused_without_a_crash() {
    let (server, registry) = start();
    let page = 4096;
    // SAFETY: a fresh anonymous mapping, owned by this test alone.
    let memory = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(memory, libc::MAP_FAILED);
    let addr = memory as u64;
    // SAFETY: the memory is only ever accessed by the server, through the kernel
    // (TCP-2), which is what this test checks.
    let region = unsafe { registry.register(addr, 2 * page, None) }.unwrap();
    let o = opts(2, 1 << 20);
    write(server, &region, &vec![3u8; 2 * page], &o).unwrap();

    // Read-only: reads work, writes are refused.
    // SAFETY: changes the protection of the test's own mapping.
    let rc = unsafe { libc::mprotect(memory, 2 * page, libc::PROT_READ) };
    assert_eq!(rc, 0);
    let err = write(server, &region, &vec![4u8; 2 * page], &o).unwrap_err();
    assert!(
        matches!(&err, RdmaError::Refused { message, .. } if message.contains("not writable")),
        "{err}"
    );
    let mut dst = vec![0u8; 2 * page];
    read(server, &region, &mut dst, &o).unwrap();
    assert!(dst.iter().all(|&b| b == 3));

    // The second page unmapped: refused, the framing kept, the server alive.
    // SAFETY: unmaps the test's own page, which nothing references.
    let rc = unsafe { libc::munmap(memory.cast::<u8>().add(page).cast(), page) };
    assert_eq!(rc, 0);
    let err = read(server, &region, &mut dst, &o).unwrap_err();
    assert!(
        matches!(&err, RdmaError::Refused { message, .. } if message.contains("not readable")),
        "{err}"
    );
    let first = region.range(0, page).unwrap();
    read(server, &first, &mut dst[..page], &o).unwrap();
    assert!(dst[..page].iter().all(|&b| b == 3));
    // SAFETY: unmaps the rest of the test's mapping.
    let rc = unsafe { libc::munmap(memory, page) };
    assert_eq!(rc, 0);
    let err = write(server, &first, &vec![5u8; page], &o).unwrap_err();
    assert!(matches!(err, RdmaError::Refused { .. }), "{err}");
    ping(server, &o).unwrap();
}

#[test]
fn a_dead_owner_is_reported_promptly_even_over_a_pooled_connection() {
    // A server that answers one PING, then exits: its sockets close.
    let (server, thread) = fake_server(|mut stream| {
        let mut head = [0u8; REQUEST_BYTES];
        stream.read_exact(&mut head).unwrap();
        let reply = Reply { status: OK, len: 0 };
        stream.write_all(&reply.encode()).unwrap();
    });
    ping(server, &opts(1, 1 << 20)).unwrap();
    assert_eq!(pooled(server), 1);
    thread.join().unwrap();
    // No deadline: the closed connection and the refused reconnection end it.
    let started = Instant::now();
    let err = ping(server, &TcpOptions::default()).unwrap_err();
    assert!(matches!(err, RdmaError::Unreachable { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(pooled(server), 0);
}

#[test]
fn a_malformed_request_closes_only_its_connection() {
    let (server, registry) = start();
    let region = register(registry, &pattern(100, 2), 0);
    let mut bad = TcpStream::connect(server).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    bad.write_all(&[0xAB; REQUEST_BYTES]).unwrap();
    let mut answer = Vec::new();
    bad.read_to_end(&mut answer).unwrap();
    let reply = Reply::decode(answer[..REPLY_BYTES].try_into().unwrap()).unwrap();
    assert_eq!(reply.status, BAD_REQUEST);
    assert!(String::from_utf8_lossy(&answer[REPLY_BYTES..]).contains("magic"));

    let mut unknown = Request::for_region(OP_READ, &region, 0, 100);
    unknown.op = 99;
    let mut bad = TcpStream::connect(server).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    bad.write_all(&unknown.encode()).unwrap();
    let mut answer = Vec::new();
    bad.read_to_end(&mut answer).unwrap();
    assert!(String::from_utf8_lossy(&answer).contains("unknown operation 99"));

    let mut dst = vec![0u8; 100];
    read(server, &region, &mut dst, &opts(1, 1 << 20)).unwrap();
    assert_eq!(dst, pattern(100, 2));
}

#[test]
fn concurrent_transfers_to_one_region() {
    let (server, registry) = start();
    let slice = 256 << 10;
    let threads = 8;
    let region = register(registry, &vec![0u8; slice * threads], 0);
    std::thread::scope(|scope| {
        for t in 0..threads {
            scope.spawn(move || {
                let mine = region.range(t * slice, slice).unwrap();
                let data = pattern(slice, t as u8);
                let o = opts(1 + t % 3, 64 << 10);
                for _ in 0..5 {
                    write(server, &mine, &data, &o).unwrap();
                    let mut back = vec![0u8; slice];
                    read(server, &mine, &mut back, &o).unwrap();
                    assert!(back == data, "thread {t}");
                    // Whole-region reads alongside the others' writes.
                    let mut whole = vec![0u8; region.len];
                    read(server, &region, &mut whole, &o).unwrap();
                    assert!(whole[t * slice..(t + 1) * slice] == data[..]);
                }
            });
        }
    });
    let expected: Vec<u8> = (0..threads).flat_map(|t| pattern(slice, t as u8)).collect();
    assert!(contents(&region) == expected);
}

#[test]
fn serve_is_started_once_and_serves_the_global_registry() {
    let addr = serve().unwrap();
    assert_eq!(serve().unwrap(), addr);
    let region = register(Registry::global(), &pattern(5000, 6), 0);
    let mut dst = vec![0u8; 5000];
    read(addr, &region, &mut dst, &opts(2, 1 << 20)).unwrap();
    assert_eq!(dst, pattern(5000, 6));
    assert!(Registry::global().deregister(region.id));
}

#[test]
fn pieces_are_about_even_and_bounded() {
    let o = |parallelism, chunk_bytes| TcpOptions {
        parallelism,
        chunk_bytes,
        deadline: None,
    };
    assert_eq!(piece_bytes(64 << 20, &o(4, 64 << 20)), 16 << 20);
    assert_eq!(piece_bytes(64 << 20, &o(1, 8 << 20)), 8 << 20);
    assert_eq!(piece_bytes(3 << 20, &o(8, 64 << 20)), MIN_PIECE);
    assert_eq!(piece_bytes(100, &o(8, 64 << 20)), MIN_PIECE);
    assert_eq!(piece_bytes(100, &o(8, 10)), 10);
    assert_eq!(piece_bytes(100, &o(0, 0)), 1);
    let request = Request {
        op: OP_CONTROL,
        kind: 17,
        pid: 9,
        id: 1 << 40,
        key: u64::MAX,
        addr: 0xdead_beef,
        len: 12,
    };
    assert_eq!(Request::decode(&request.encode()), Some(request));
}

/// Throughput over loopback (or, with `MONARCH_RDMA_TCP_BENCH_NETNS=A,B,IP`,
/// between network namespaces A and B, the server in A listening at IP). Run with
/// `cargo test --release -p monarch_rdma tcp::tests::bench -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench() {
    let registry: &'static Registry = Box::leak(Box::new(Registry::new()));
    let netns = std::env::var("MONARCH_RDMA_TCP_BENCH_NETNS")
        .ok()
        .filter(|v| !v.is_empty());
    let enter = |name: &str| {
        let file = std::fs::File::open(format!("/var/run/netns/{name}")).unwrap();
        // SAFETY: moves this thread into the namespace of an open file.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {name}: {}", io::Error::last_os_error());
    };
    let server = match &netns {
        Some(spec) => {
            let parts: Vec<String> = spec.split(',').map(str::to_owned).collect();
            let (a, b, ip) = (parts[0].clone(), parts[1].clone(), parts[2].clone());
            let server = std::thread::spawn(move || {
                enter(&a);
                serve_registry(registry, SocketAddr::new(ip.parse().unwrap(), 0), None).unwrap()
            })
            .join()
            .unwrap();
            enter(&b);
            server
        }
        None => serve_registry(registry, "127.0.0.1:0".parse().unwrap(), None).unwrap(),
    };
    let len = 64 << 20;
    let region = register(registry, &pattern(len, 1), 0);
    let mut local = pattern(len, 2);
    let rounds = 10;
    for parallelism in [1, 2, 4] {
        let o = TcpOptions {
            parallelism,
            ..TcpOptions::default()
        };
        // Warm up: connections into the pool, pages touched.
        read(server, &region, &mut local, &o).unwrap();
        write(server, &region, &local, &o).unwrap();
        let started = Instant::now();
        for _ in 0..rounds {
            read(server, &region, &mut local, &o).unwrap();
        }
        let read_gbs = (rounds * len) as f64 / started.elapsed().as_secs_f64() / 1e9;
        let started = Instant::now();
        for _ in 0..rounds {
            write(server, &region, &local, &o).unwrap();
        }
        let write_gbs = (rounds * len) as f64 / started.elapsed().as_secs_f64() / 1e9;
        println!(
            "64 MiB, parallelism {parallelism}: read {read_gbs:.2} GB/s, write {write_gbs:.2} GB/s"
        );
    }
}
