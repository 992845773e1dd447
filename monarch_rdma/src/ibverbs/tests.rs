use std::mem::{align_of, offset_of, size_of};

use super::sys::*;
use super::*;

/// What this machine offers, found independently of the backend: whether the library
/// loads, and the RDMA devices sysfs lists.
fn machine() -> (bool, Vec<String>) {
    let name = c"libibverbs.so.1";
    // SAFETY: dlopen with a NUL-terminated name; the handle is closed at once (the
    // backend holds its own).
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    let present = !handle.is_null();
    if present {
        // SAFETY: a handle from dlopen, closed once.
        unsafe { libc::dlclose(handle) };
    }
    let devices = std::fs::read_dir("/sys/class/infiniband")
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    (present, devices)
}

#[test]
fn probe_reports_what_this_machine_has_without_panicking() {
    let probe = probe();
    assert_eq!(probe.available(), probe.reason.is_none());
    if env_flag(std::env::var(DISABLE_ENV).ok().as_deref()) {
        assert_eq!(probe.reason.as_deref(), Some(REASON_DISABLED));
        return;
    }
    let (present, devices) = machine();
    if !present {
        assert_eq!(probe.reason.as_deref(), Some(REASON_MISSING));
        assert!(probe.devices.is_empty());
    } else if devices.is_empty() {
        assert_eq!(probe.reason.as_deref(), Some(REASON_NO_DEVICE));
        assert!(probe.devices.is_empty());
    } else {
        let mut found = probe.devices.clone();
        found.sort();
        let mut expected = devices;
        expected.sort();
        assert_eq!(found, expected);
    }
    // Probing again (uncached) agrees, and the cached answer is stable.
    let again = probe_with(false);
    if std::env::var(DEVICE_ENV).is_err() {
        assert_eq!(again, *probe);
    }
    assert!(std::ptr::eq(probe, super::probe()));
}

#[test]
fn the_backend_can_be_disabled() {
    let probe = probe_with(true);
    assert!(!probe.available());
    assert_eq!(probe.reason.as_deref(), Some(REASON_DISABLED));
    assert!(probe.devices.is_empty());
    for on in ["1", "true", "TRUE", " yes ", "on"] {
        assert!(env_flag(Some(on)), "{on:?}");
    }
    for off in ["", "0", "false", "no", "off", "2"] {
        assert!(!env_flag(Some(off)), "{off:?}");
    }
    assert!(!env_flag(None));
}

#[test]
fn every_entry_point_fails_cleanly_without_the_backend() {
    if probe().available() {
        return; // a machine with a device: covered by the data-path tests there
    }
    let reason = probe().reason.clone().unwrap_or_default();
    let mut memory = vec![0u8; 64];
    let region = RemoteRegion {
        pid: 1,
        id: 1,
        addr: memory.as_ptr() as u64,
        len: memory.len(),
        key: 0,
        slot: 0,
    };
    let server: SocketAddr = ([127, 0, 0, 1], 9).into();
    let unavailable = |e: RdmaError| match e {
        RdmaError::Unavailable { reason: r } => {
            assert_eq!(r, reason);
            let text = RdmaError::Unavailable { reason: r }.to_string();
            assert!(text.contains("use another backend"), "{text}");
        }
        other => panic!("expected Unavailable, got {other}"),
    };
    unavailable(read(server, &region, 7, &mut memory, None).unwrap_err());
    unavailable(write(server, &region, 7, &memory, None).unwrap_err());
    unavailable(register_for_peer(&region).unwrap_err());
    // SAFETY: nothing is registered without the backend.
    unavailable(unsafe { register(region.addr, region.len) }.unwrap_err());
    assert!(!deregister(region.addr));
    assert!(!release_for_peer(&region));

    // Sizes are checked first, whatever the backend.
    let err = read(server, &region, 7, &mut memory[..63], None).unwrap_err();
    assert!(
        matches!(
            err,
            RdmaError::SizeMismatch {
                remote: 64,
                local: 63
            }
        ),
        "{err}"
    );

    // A requester is told why this owner cannot connect.
    let info = QpInfo {
        lid: 1,
        gid: [0; 16],
        qp_num: 5,
        psn: 6,
        port: 1,
        mtu: 5,
        link_layer: 1,
        rd_atomic: 16,
        link: 9,
    };
    let err = handle_connect(&info.encode()).unwrap_err();
    assert!(err.contains(&reason), "{err}");
}

#[test]
fn a_malformed_connection_request_is_refused_with_a_reason() {
    let err = handle_connect(b"nonsense").unwrap_err();
    assert!(err.contains("malformed"), "{err}");
    let err = QpInfo::decode(&[]).unwrap_err();
    assert!(err.to_string().contains("0 bytes"), "{err}");
    assert_eq!(
        err,
        IbvError::MalformedQpInfo {
            len: 0,
            version: 0,
            expected_len: QpInfo::LEN,
            expected_version: 1,
        }
    );
    let mut wrong_version = vec![0u8; QpInfo::LEN];
    wrong_version[0] = 99;
    assert!(QpInfo::decode(&wrong_version).is_err());
}

#[test]
fn ibverbs_errors_keep_their_messages() {
    let os = |errno: i32| std::io::Error::from_raw_os_error(errno).to_string();
    let cases = [
        (IbvError::LibraryMissing, REASON_MISSING.to_string()),
        (IbvError::NoDevice, REASON_NO_DEVICE.to_string()),
        (
            IbvError::MissingSymbol {
                symbol: "ibv_reg_mr",
            },
            "libibverbs.so.1 has no function ibv_reg_mr: it is too old or not rdma-core's \
             libibverbs"
                .to_string(),
        ),
        (
            IbvError::OpenDevice {
                device: "mlx5_0".into(),
                errno: libc::ENODEV,
            },
            format!("ibv_open_device(mlx5_0): {}", os(libc::ENODEV)),
        ),
        (
            IbvError::QueryDevice {
                device: "mlx5_0".into(),
                errno: libc::EINVAL,
            },
            format!("ibv_query_device(mlx5_0): {}", os(libc::EINVAL)),
        ),
        (
            IbvError::NoActivePort {
                device: "mlx5_0".into(),
                ports: vec![
                    PortState::QueryFailed {
                        port: 1,
                        errno: libc::EIO,
                    },
                    PortState::NotActive { port: 2, state: 1 },
                ],
            },
            format!(
                "the RDMA device mlx5_0 has no active port (port 1: {}, port 2: state 1); \
                 check the cable and `ibv_devinfo`",
                os(libc::EIO)
            ),
        ),
        (
            IbvError::BadGidIndex { value: "x".into() },
            "MONARCH_RDMA_IBVERBS_GID_INDEX=\"x\" is not a GID index (0..=255)".to_string(),
        ),
        (
            IbvError::QueryGid {
                device: "mlx5_0".into(),
                port: 1,
                index: 3,
                errno: libc::EINVAL,
            },
            format!(
                "ibv_query_gid(mlx5_0, port 1, index 3): {}",
                os(libc::EINVAL)
            ),
        ),
        (
            IbvError::AllocPd {
                device: "mlx5_0".into(),
                errno: libc::ENOMEM,
            },
            format!("ibv_alloc_pd(mlx5_0): {}", os(libc::ENOMEM)),
        ),
        (
            IbvError::MalformedQpInfo {
                len: 8,
                version: 110,
                expected_len: 39,
                expected_version: 1,
            },
            "malformed ibverbs connection data (8 bytes, version 110; expected 39 bytes, \
             version 1): both sides must run the same Monarch version"
                .to_string(),
        ),
        (
            IbvError::LinkLayerMismatch {
                local: 2,
                remote: 1,
            },
            "the two RDMA ports are on different link layers (2 here, 1 there; 1 is \
             InfiniBand, 2 Ethernet/RoCE): they cannot connect"
                .to_string(),
        ),
    ];
    for (error, text) in cases {
        assert_eq!(error.to_string(), text);
    }
    // The device's error is cached, so it is cloneable; the transfer paths turn it
    // into RdmaError::Verbs with the same text.
    let cached = IbvError::NoDevice;
    let text = verbs("opening the RDMA device", cached.clone().to_string()).to_string();
    assert_eq!(
        text,
        format!("the ibverbs call opening the RDMA device failed: {REASON_NO_DEVICE}")
    );
}

#[test]
fn queue_pair_addresses_round_trip() {
    let info = QpInfo {
        lid: 0xbeef,
        gid: std::array::from_fn(|i| i as u8 * 7),
        qp_num: 0x00ab_cdef,
        psn: 0x0012_3456,
        port: 2,
        mtu: 5,
        link_layer: 2,
        rd_atomic: 16,
        link: 0x0102_0304_0506_0708,
    };
    let bytes = info.encode();
    assert_eq!(bytes.len(), QpInfo::LEN);
    assert_eq!(QpInfo::decode(&bytes).unwrap(), info);
    assert!(QpInfo::decode(&bytes[..bytes.len() - 1]).is_err());
    assert!(new_psn() < 1 << 24);
}

fn roce_port() -> Port {
    Port {
        num: 1,
        lid: 0,
        gid: [0xfe; 16],
        gid_index: 3,
        mtu: 5,
        link_layer: IBV_LINK_LAYER_ETHERNET,
    }
}

fn peer(link_layer: u8, lid: u16, mtu: u8) -> QpInfo {
    QpInfo {
        lid,
        gid: [0x11; 16],
        qp_num: 77,
        psn: 1234,
        port: 1,
        mtu,
        link_layer,
        rd_atomic: 8,
        link: 1,
    }
}

#[test]
fn queue_pair_transitions_carry_the_peer_address() {
    let (init, mask) = init_attr(2);
    assert_eq!(init.qp_state, IBV_QPS_INIT);
    assert_eq!(init.port_num, 2);
    assert_eq!(
        init.qp_access_flags,
        (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE) as u32
    );
    assert_eq!(mask, 0b11_1001); // STATE | ACCESS_FLAGS | PKEY_INDEX | PORT

    // RoCE: routed by GID, through the chosen source GID; the smaller MTU wins.
    let local = roce_port();
    let (rtr, mask) = rtr_attr(&local, &peer(IBV_LINK_LAYER_ETHERNET, 0, 3), 16);
    assert_eq!(rtr.qp_state, IBV_QPS_RTR);
    assert_eq!((rtr.dest_qp_num, rtr.rq_psn), (77, 1234));
    assert_eq!(rtr.path_mtu, 3);
    assert_eq!(rtr.max_dest_rd_atomic, 16);
    assert_eq!(rtr.ah_attr.is_global, 1);
    assert_eq!(rtr.ah_attr.grh.dgid.raw, [0x11; 16]);
    assert_eq!(rtr.ah_attr.grh.sgid_index, 3);
    assert_eq!(rtr.ah_attr.port_num, 1);
    assert!(rtr.ah_attr.grh.hop_limit > 1);
    for bit in [
        IBV_QP_STATE,
        IBV_QP_AV,
        IBV_QP_PATH_MTU,
        IBV_QP_DEST_QPN,
        IBV_QP_RQ_PSN,
        IBV_QP_MAX_DEST_RD_ATOMIC,
        IBV_QP_MIN_RNR_TIMER,
    ] {
        assert_ne!(mask & bit, 0, "{bit:#x}");
    }

    // InfiniBand with a LID: routed by LID, no GRH.
    let ib = Port {
        lid: 4,
        link_layer: 1,
        ..roce_port()
    };
    let (rtr, _) = rtr_attr(&ib, &peer(1, 9, 5), 16);
    assert_eq!(rtr.ah_attr.is_global, 0);
    assert_eq!(rtr.ah_attr.dlid, 9);
    assert_eq!(rtr.path_mtu, 5);

    let (rts, mask) = rts_attr(42, 0);
    assert_eq!(rts.qp_state, IBV_QPS_RTS);
    assert_eq!(rts.sq_psn, 42);
    assert_eq!(rts.max_rd_atomic, 1, "at least one read in flight");
    assert!(rts.retry_cnt > 0 && rts.timeout > 0);
    for bit in [
        IBV_QP_STATE,
        IBV_QP_TIMEOUT,
        IBV_QP_RETRY_CNT,
        IBV_QP_RNR_RETRY,
        IBV_QP_SQ_PSN,
        IBV_QP_MAX_QP_RD_ATOMIC,
    ] {
        assert_ne!(mask & bit, 0, "{bit:#x}");
    }

    assert!(check_compatible(&local, &peer(IBV_LINK_LAYER_ETHERNET, 0, 5)).is_ok());
    let err = check_compatible(&local, &peer(1, 3, 5)).unwrap_err();
    assert!(err.to_string().contains("different link layers"), "{err}");
    assert_eq!(
        err,
        IbvError::LinkLayerMismatch {
            local: IBV_LINK_LAYER_ETHERNET,
            remote: 1
        }
    );
}

#[test]
fn roce_prefers_an_ipv4_roce_v2_gid() {
    let link_local = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
    let mut ipv4 = [0u8; 16];
    ipv4[10] = 0xff;
    ipv4[11] = 0xff;
    ipv4[12..].copy_from_slice(&[10, 0, 0, 1]);
    let v1 = Some("IB/RoCE v1\n".to_string());
    let v2 = Some("RoCE v2\n".to_string());
    let table: Vec<GidEntry> = vec![
        (0, link_local, v1.clone()),
        (1, link_local, v2.clone()),
        (2, ipv4, v1),
        (3, ipv4, v2.clone()),
    ];
    assert_eq!(choose_gid_index(&table, true), 3);
    assert_eq!(choose_gid_index(&table[..3], true), 1);
    assert_eq!(choose_gid_index(&table[..1], true), 0);
    assert_eq!(
        choose_gid_index(&[(5, [0; 16], v2.clone()), (6, link_local, None)], true),
        6
    );
    assert_eq!(choose_gid_index(&[], true), 0);
    assert_eq!(choose_gid_index(&table, false), 0, "InfiniBand uses GID 0");
}

#[test]
fn transfers_are_split_in_pieces_of_at_most_the_largest_message() {
    assert_eq!(pieces(0, 10).count(), 0);
    assert_eq!(pieces(10, 10).collect::<Vec<_>>(), vec![(0, 10)]);
    assert_eq!(
        pieces(25, 10).collect::<Vec<_>>(),
        vec![(0, 10), (10, 10), (20, 5)]
    );
    assert_eq!(
        pieces(3, 0).count(),
        3,
        "a zero maximum means one byte at a time"
    );
    let big = 5 * MAX_PIECE + 17;
    let split: Vec<_> = pieces(big, MAX_PIECE).collect();
    assert_eq!(split.len(), 6);
    assert!(split
        .iter()
        .all(|&(_, n)| n <= MAX_PIECE && u32::try_from(n).is_ok()));
    assert_eq!(split.iter().map(|&(_, n)| n).sum::<usize>(), big);
    assert!(split.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
}

fn fake_mr(start: u64, len: usize, writable: bool) -> CachedMr {
    CachedMr {
        mr: std::ptr::null_mut(),
        start,
        len,
        lkey: start as u32,
        rkey: start as u32 + 1,
        writable,
        refs: 0,
    }
}

#[test]
fn the_registration_cache_reuses_covering_registrations_and_counts_users() {
    let mut cache = MrCache::default();
    let a = cache.insert(fake_mr(0x1000, 0x1000, true));
    cache.push_handle(0x1000, a);
    let ro = cache.insert(fake_mr(0x8000, 0x100, false));
    cache.push_handle(0x8000, ro);

    assert_eq!(cache.covering(0x1000, 0x1000, true), Some(a));
    assert_eq!(cache.covering(0x1800, 0x10, true), Some(a));
    assert_eq!(
        cache.covering(0x1800, 0x900, false),
        None,
        "runs past the end"
    );
    assert_eq!(cache.covering(0x0fff, 2, false), None, "starts before");
    assert_eq!(cache.covering(u64::MAX, 2, false), None, "overflow");
    assert_eq!(cache.covering(0x8000, 0x10, false), Some(ro));
    assert_eq!(
        cache.covering(0x8000, 0x10, true),
        None,
        "read-only cannot be written"
    );

    // A writable registration is preferred when both cover.
    let wide = cache.insert(fake_mr(0x8000, 0x1000, true));
    assert_eq!(cache.covering(0x8000, 0x10, false), Some(wide));
    assert!(cache.release(wide).is_some());

    // A second user of `a` (a transfer, or a registration of a sub-range).
    assert_eq!(cache.acquire(a), Some((0x1000, 0x1001)));
    cache.push_handle(0x1800, a);
    assert!(matches!(cache.pop_handle(0x1000), Some(None)), "still used");
    assert!(
        cache.pop_handle(0x1000).is_none(),
        "one registration of 0x1000"
    );
    let last = cache.pop_handle(0x1800);
    assert!(matches!(last, Some(Some(CachedMr { start: 0x1000, .. }))));
    assert_eq!(cache.covering(0x1000, 1, false), None);
    assert!(cache.acquire(a).is_none());
    assert!(cache.release(a).is_none());
}

#[test]
fn failed_completions_name_the_status_and_what_to_do() {
    let job = Job {
        op: Op::Read,
        pid: 4242,
        id: 17,
        local: 0,
        lkey: 0,
        remote: 0,
        rkey: 0,
        len: 1,
    };
    let err = completion_error(&job, IBV_WC_REM_ACCESS_ERR, 0, "remote access error".into());
    assert!(
        matches!(err, RdmaError::Dropped { pid: 4242, id: 17 }),
        "{err}"
    );
    let err = completion_error(
        &job,
        IBV_WC_RETRY_EXC_ERR,
        0x81,
        "transport retry counter exceeded".into(),
    );
    let text = err.to_string();
    for part in [
        "read",
        "4242",
        "transport retry counter exceeded",
        "0x81",
        "exited",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
    let err = completion_error(
        &Job {
            op: Op::Write,
            ..job
        },
        99,
        0,
        "status 99".into(),
    );
    assert!(err.to_string().contains("RDMA write"), "{err}");
}

#[test]
fn waiting_for_a_busy_connection_honours_the_deadline() {
    let slot = Arc::new(std::sync::Mutex::new(Some(1u32)));
    let held = slot.lock().unwrap();
    let start = Instant::now();
    let other = Arc::clone(&slot);
    let waited = std::thread::spawn(move || {
        lock_until(&other, Some(Instant::now() + Duration::from_millis(50))).is_none()
    })
    .join()
    .unwrap();
    assert!(waited, "gave up at the deadline");
    assert!(start.elapsed() >= Duration::from_millis(50));
    drop(held);
    assert_eq!(*lock_until(&slot, None).unwrap(), Some(1));

    // A panic while the slot was held empties it: that connection's state is unknown.
    let poisoner = Arc::clone(&slot);
    let _ = std::thread::spawn(move || {
        let _guard = poisoner.lock().unwrap();
        panic!("poison the slot");
    })
    .join();
    assert!(slot.is_poisoned());
    assert_eq!(*lock_until(&slot, None).unwrap(), None);
    assert!(!slot.is_poisoned());
}

/// Sizes and offsets of the C structs, as rdma-core's `verbs.h` lays them out on LP64
/// Linux (x86_64 and aarch64). Each number was worked out from the header, and all of
/// them (with the constants in `sys`) were checked by compiling a C program printing
/// `sizeof` / `offsetof` against rdma-core 50's installed `verbs.h` on x86_64.
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
#[test]
fn struct_layouts_match_verbs_h() {
    let mutex = size_of::<libc::pthread_mutex_t>();
    #[cfg(target_arch = "x86_64")]
    assert_eq!(mutex, 40);
    #[cfg(target_arch = "aarch64")]
    assert_eq!(mutex, 48);

    // ibv_context and its ops table (ibv_post_send / ibv_poll_cq call through it).
    assert_eq!(size_of::<ibv_context_ops>(), 32 * 8);
    assert_eq!(offset_of!(ibv_context_ops, poll_cq), 11 * 8);
    assert_eq!(offset_of!(ibv_context_ops, post_send), 25 * 8);
    assert_eq!(offset_of!(ibv_context, ops), 8);
    assert_eq!(
        offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, poll_cq),
        96
    );
    assert_eq!(
        offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send),
        208
    );
    assert_eq!(offset_of!(ibv_context, cmd_fd), 264);
    assert_eq!(offset_of!(ibv_context, num_comp_vectors), 272);
    assert_eq!(offset_of!(ibv_context, mutex), 280);
    assert_eq!(offset_of!(ibv_context, abi_compat), 280 + mutex);
    assert_eq!(size_of::<ibv_context>(), 288 + mutex);

    // Prefixes of library-owned structs.
    assert_eq!(offset_of!(ibv_cq, context), 0);
    assert_eq!(offset_of!(ibv_cq, cqe), 28);
    assert_eq!(offset_of!(ibv_qp, context), 0);
    assert_eq!(offset_of!(ibv_qp, qp_num), 52);
    assert_eq!(offset_of!(ibv_qp, qp_type), 60);
    assert_eq!(offset_of!(ibv_mr, lkey), 36);
    assert_eq!(offset_of!(ibv_mr, rkey), 40);
    assert_eq!(size_of::<ibv_mr>(), 48);

    assert_eq!((size_of::<ibv_gid>(), align_of::<ibv_gid>()), (16, 8));

    assert_eq!(size_of::<ibv_device_attr>(), 232);
    assert_eq!(offset_of!(ibv_device_attr, max_qp_wr), 112);
    assert_eq!(offset_of!(ibv_device_attr, max_qp_rd_atom), 144);
    assert_eq!(offset_of!(ibv_device_attr, max_qp_init_rd_atom), 156);
    assert_eq!(offset_of!(ibv_device_attr, phys_port_cnt), 227);

    assert_eq!(offset_of!(ibv_port_attr, state), 0);
    assert_eq!(offset_of!(ibv_port_attr, active_mtu), 8);
    assert_eq!(offset_of!(ibv_port_attr, gid_tbl_len), 12);
    assert_eq!(offset_of!(ibv_port_attr, max_msg_sz), 20);
    assert_eq!(offset_of!(ibv_port_attr, lid), 34);
    assert_eq!(offset_of!(ibv_port_attr, link_layer), 46);
    assert_eq!(offset_of!(ibv_port_attr, port_cap_flags2), 48);
    assert!(
        size_of::<ibv_port_attr>() >= 52 + 32,
        "room for newer fields"
    );

    assert_eq!(size_of::<ibv_qp_cap>(), 20);
    assert_eq!(size_of::<ibv_qp_init_attr>(), 64);
    assert_eq!(offset_of!(ibv_qp_init_attr, send_cq), 8);
    assert_eq!(offset_of!(ibv_qp_init_attr, cap), 32);
    assert_eq!(offset_of!(ibv_qp_init_attr, qp_type), 52);
    assert_eq!(offset_of!(ibv_qp_init_attr, sq_sig_all), 56);

    assert_eq!(size_of::<ibv_global_route>(), 24);
    assert_eq!(offset_of!(ibv_global_route, sgid_index), 20);
    assert_eq!(size_of::<ibv_ah_attr>(), 32);
    assert_eq!(offset_of!(ibv_ah_attr, dlid), 24);
    assert_eq!(offset_of!(ibv_ah_attr, is_global), 29);
    assert_eq!(offset_of!(ibv_ah_attr, port_num), 30);

    assert_eq!(size_of::<ibv_qp_attr>(), 144);
    assert_eq!(offset_of!(ibv_qp_attr, path_mtu), 8);
    assert_eq!(offset_of!(ibv_qp_attr, rq_psn), 20);
    assert_eq!(offset_of!(ibv_qp_attr, sq_psn), 24);
    assert_eq!(offset_of!(ibv_qp_attr, dest_qp_num), 28);
    assert_eq!(offset_of!(ibv_qp_attr, qp_access_flags), 32);
    assert_eq!(offset_of!(ibv_qp_attr, cap), 36);
    assert_eq!(offset_of!(ibv_qp_attr, ah_attr), 56);
    assert_eq!(offset_of!(ibv_qp_attr, alt_ah_attr), 88);
    assert_eq!(offset_of!(ibv_qp_attr, pkey_index), 120);
    assert_eq!(offset_of!(ibv_qp_attr, max_rd_atomic), 126);
    assert_eq!(offset_of!(ibv_qp_attr, max_dest_rd_atomic), 127);
    assert_eq!(offset_of!(ibv_qp_attr, min_rnr_timer), 128);
    assert_eq!(offset_of!(ibv_qp_attr, port_num), 129);
    assert_eq!(offset_of!(ibv_qp_attr, timeout), 130);
    assert_eq!(offset_of!(ibv_qp_attr, retry_cnt), 131);
    assert_eq!(offset_of!(ibv_qp_attr, rnr_retry), 132);
    assert_eq!(offset_of!(ibv_qp_attr, rate_limit), 136);

    assert_eq!(size_of::<ibv_sge>(), 16);
    assert_eq!(offset_of!(ibv_sge, lkey), 12);

    assert_eq!(size_of::<ibv_send_wr>(), 128);
    assert_eq!(offset_of!(ibv_send_wr, sg_list), 16);
    assert_eq!(offset_of!(ibv_send_wr, num_sge), 24);
    assert_eq!(offset_of!(ibv_send_wr, opcode), 28);
    assert_eq!(offset_of!(ibv_send_wr, send_flags), 32);
    assert_eq!(offset_of!(ibv_send_wr, rdma), 40);
    assert_eq!(
        offset_of!(ibv_send_wr, rdma) + offset_of!(ibv_rdma_wr, rkey),
        48
    );
    assert_eq!(size_of::<ibv_rdma_wr>(), 32);
    assert_eq!(offset_of!(ibv_send_wr, remote_srqn), 72);

    assert_eq!(size_of::<ibv_wc>(), 48);
    assert_eq!(offset_of!(ibv_wc, status), 8);
    assert_eq!(offset_of!(ibv_wc, opcode), 12);
    assert_eq!(offset_of!(ibv_wc, vendor_err), 16);
    assert_eq!(offset_of!(ibv_wc, byte_len), 20);
    assert_eq!(offset_of!(ibv_wc, qp_num), 28);
    assert_eq!(offset_of!(ibv_wc, wc_flags), 36);
    assert_eq!(offset_of!(ibv_wc, sl), 44);
}
