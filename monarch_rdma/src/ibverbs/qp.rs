//! Queue-pair addressing: the port and GID a process uses, the connection payload two
//! sides exchange, and the attributes of each queue-pair state transition.

use super::*;

/// The port this process uses and its address on the fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Port {
    /// The port number (from 1).
    pub(super) num: u8,
    /// The port's LID (InfiniBand; 0 on RoCE).
    pub(super) lid: u16,
    /// The GID at `gid_index`.
    pub(super) gid: [u8; 16],
    /// The GID table index used as source GID.
    pub(super) gid_index: u8,
    /// The active MTU (`enum ibv_mtu`, 1..=5).
    pub(super) mtu: u8,
    /// `IBV_LINK_LAYER_*`.
    pub(super) link_layer: u8,
}

/// A queue pair's address, as exchanged at connection (the [`KIND_IBV_CONNECT`]
/// payload and answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct QpInfo {
    pub(super) lid: u16,
    pub(super) gid: [u8; 16],
    pub(super) qp_num: u32,
    pub(super) psn: u32,
    pub(super) port: u8,
    pub(super) mtu: u8,
    pub(super) link_layer: u8,
    /// Outstanding RDMA reads this side accepts as responder.
    pub(super) rd_atomic: u8,
    /// The requester's id for the connection: an owner keeps one queue pair per link.
    pub(super) link: u64,
}

impl QpInfo {
    const VERSION: u8 = 1;
    pub(super) const LEN: usize = 1 + 2 + 16 + 4 + 4 + 1 + 1 + 1 + 1 + 8;

    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::LEN);
        out.push(Self::VERSION);
        out.extend_from_slice(&self.lid.to_le_bytes());
        out.extend_from_slice(&self.gid);
        out.extend_from_slice(&self.qp_num.to_le_bytes());
        out.extend_from_slice(&self.psn.to_le_bytes());
        out.extend_from_slice(&[self.port, self.mtu, self.link_layer, self.rd_atomic]);
        out.extend_from_slice(&self.link.to_le_bytes());
        out
    }

    pub(super) fn decode(bytes: &[u8]) -> Result<Self, IbvError> {
        if bytes.len() != Self::LEN || bytes[0] != Self::VERSION {
            return Err(IbvError::MalformedQpInfo {
                len: bytes.len(),
                version: bytes.first().copied().unwrap_or(0),
                expected_len: Self::LEN,
                expected_version: Self::VERSION,
            });
        }
        let mut rest = &bytes[1..];
        let mut take = |n: usize| {
            let (field, tail) = rest.split_at(n);
            rest = tail;
            field
        };
        let lid = take(2);
        let lid = u16::from_le_bytes([lid[0], lid[1]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(take(16));
        let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let qp_num = word(take(4));
        let psn = word(take(4));
        let small = take(4);
        let (port, mtu, link_layer, rd_atomic) = (small[0], small[1], small[2], small[3]);
        let mut link = [0u8; 8];
        link.copy_from_slice(take(8));
        Ok(Self {
            lid,
            gid,
            qp_num,
            psn,
            port,
            mtu,
            link_layer,
            rd_atomic,
            link: u64::from_le_bytes(link),
        })
    }
}

/// Checks that two ports can talk.
pub(super) fn check_compatible(local: &Port, remote: &QpInfo) -> Result<(), IbvError> {
    if local.link_layer != remote.link_layer {
        return Err(IbvError::LinkLayerMismatch {
            local: local.link_layer,
            remote: remote.link_layer,
        });
    }
    Ok(())
}

/// Attributes for RESET → INIT.
pub(super) fn init_attr(port: u8) -> (ibv_qp_attr, c_int) {
    let attr = ibv_qp_attr {
        qp_state: sys::IBV_QPS_INIT,
        pkey_index: 0,
        port_num: port,
        qp_access_flags: (sys::IBV_ACCESS_LOCAL_WRITE
            | sys::IBV_ACCESS_REMOTE_READ
            | sys::IBV_ACCESS_REMOTE_WRITE) as u32,
        ..Default::default()
    };
    let mask =
        sys::IBV_QP_STATE | sys::IBV_QP_PKEY_INDEX | sys::IBV_QP_PORT | sys::IBV_QP_ACCESS_FLAGS;
    (attr, mask)
}

/// Attributes for INIT → RTR against `remote`; `rd_atomic` is how many RDMA reads this
/// side serves at once.
pub(super) fn rtr_attr(local: &Port, remote: &QpInfo, rd_atomic: u8) -> (ibv_qp_attr, c_int) {
    let mtu = u32::from(local.mtu.min(remote.mtu)).clamp(sys::IBV_MTU_256, sys::IBV_MTU_4096);
    let global = local.link_layer == sys::IBV_LINK_LAYER_ETHERNET || remote.lid == 0;
    let mut attr = ibv_qp_attr {
        qp_state: sys::IBV_QPS_RTR,
        path_mtu: mtu,
        dest_qp_num: remote.qp_num,
        rq_psn: remote.psn,
        max_dest_rd_atomic: rd_atomic.max(1),
        min_rnr_timer: 12,
        ..Default::default()
    };
    attr.ah_attr.dlid = remote.lid;
    attr.ah_attr.sl = 0;
    attr.ah_attr.src_path_bits = 0;
    attr.ah_attr.port_num = local.num;
    if global {
        attr.ah_attr.is_global = 1;
        attr.ah_attr.grh.dgid.raw = remote.gid;
        attr.ah_attr.grh.sgid_index = local.gid_index;
        attr.ah_attr.grh.hop_limit = HOP_LIMIT;
    }
    let mask = sys::IBV_QP_STATE
        | sys::IBV_QP_AV
        | sys::IBV_QP_PATH_MTU
        | sys::IBV_QP_DEST_QPN
        | sys::IBV_QP_RQ_PSN
        | sys::IBV_QP_MAX_DEST_RD_ATOMIC
        | sys::IBV_QP_MIN_RNR_TIMER;
    (attr, mask)
}

/// Attributes for RTR → RTS; `rd_atomic` is how many RDMA reads this side issues at
/// once (at most what the peer serves).
pub(super) fn rts_attr(psn: u32, rd_atomic: u8) -> (ibv_qp_attr, c_int) {
    let attr = ibv_qp_attr {
        qp_state: sys::IBV_QPS_RTS,
        sq_psn: psn,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: rd_atomic.max(1),
        ..Default::default()
    };
    let mask = sys::IBV_QP_STATE
        | sys::IBV_QP_TIMEOUT
        | sys::IBV_QP_RETRY_CNT
        | sys::IBV_QP_RNR_RETRY
        | sys::IBV_QP_SQ_PSN
        | sys::IBV_QP_MAX_QP_RD_ATOMIC;
    (attr, mask)
}

/// A fresh 24-bit packet sequence number.
pub(super) fn new_psn() -> u32 {
    (random_u64() & 0x00ff_ffff) as u32
}

/// One GID table entry: index, GID, and its type as sysfs names it (`"RoCE v2"`,
/// `"IB/RoCE v1"`), when known.
pub(super) type GidEntry = (u8, [u8; 16], Option<String>);

/// The GID index to use: 0 on InfiniBand; on RoCE the first RoCE v2 GID holding an
/// IPv4 address, else the first RoCE v2 GID, else the first non-zero GID, else 0.
pub(super) fn choose_gid_index(entries: &[GidEntry], ethernet: bool) -> u8 {
    if !ethernet {
        return 0;
    }
    let live = || {
        entries
            .iter()
            .filter(|(_, gid, _)| gid.iter().any(|&b| b != 0))
    };
    let v2 = |kind: &Option<String>| {
        kind.as_deref()
            .is_some_and(|k| k.trim().eq_ignore_ascii_case("RoCE v2"))
    };
    let ipv4 = |gid: &[u8; 16]| gid[..10].iter().all(|&b| b == 0) && gid[10..12] == [0xff, 0xff];
    live()
        .find(|(_, gid, kind)| v2(kind) && ipv4(gid))
        .or_else(|| live().find(|(_, _, kind)| v2(kind)))
        .or_else(|| live().next())
        .map_or(0, |(index, _, _)| *index)
}
