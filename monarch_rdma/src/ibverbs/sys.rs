//! The small part of libibverbs this backend uses: C types declared by hand after
//! rdma-core's `<infiniband/verbs.h>` (LP64 Linux: x86_64 and aarch64), and a loader
//! that finds the library and its functions at run time with `dlopen` / `dlsym`.
//!
//! Nothing here links against libibverbs, so the crate builds and runs where it is
//! not installed; [`Lib::get`] reports its absence as an ordinary error.
//!
//! Layout notes, checked by the tests of the parent module:
//!
//! - Only structs this backend allocates, or whose fields it reads, are declared, and a
//!   struct the library owns is declared up to the last field read (a *prefix*).
//! - C unions are declared as their one member used here plus reserved bytes that give
//!   the union its C size and alignment.
//! - `ibv_post_send` and `ibv_poll_cq` are inline functions in the header: they call
//!   through `qp->context->ops.post_send` and `cq->context->ops.poll_cq`, so
//!   [`ibv_context`] and [`ibv_context_ops`] are declared in full. The ops table is part
//!   of the library's frozen ABI (retired entries were renamed `_compat_*`, never
//!   removed).
//! - `ibv_query_port` is a macro in newer headers; the exported symbol (version
//!   IBVERBS_1.1) takes a buffer of the older, shorter port-attribute layout and writes
//!   at most that much, so passing the full [`ibv_port_attr`] is safe with every version.
//! - `ibv_reg_mr` is a macro in newer headers too; it calls the exported `ibv_reg_mr`
//!   whenever no optional access flag is given, which is always the case here.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::OnceLock;

use super::error::IbvError;

/// The file name the loader opens (the SONAME of rdma-core's libibverbs).
pub(crate) const LIBRARY: &str = "libibverbs.so.1";

// enum ibv_qp_type
pub(crate) const IBV_QPT_RC: c_uint = 2;

// enum ibv_qp_state
pub(crate) const IBV_QPS_INIT: c_uint = 1;
pub(crate) const IBV_QPS_RTR: c_uint = 2;
pub(crate) const IBV_QPS_RTS: c_uint = 3;
pub(crate) const IBV_QPS_ERR: c_uint = 6;

// enum ibv_qp_attr_mask
pub(crate) const IBV_QP_STATE: c_int = 1 << 0;
pub(crate) const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub(crate) const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub(crate) const IBV_QP_PORT: c_int = 1 << 5;
pub(crate) const IBV_QP_AV: c_int = 1 << 7;
pub(crate) const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub(crate) const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub(crate) const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub(crate) const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub(crate) const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub(crate) const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub(crate) const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub(crate) const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub(crate) const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub(crate) const IBV_QP_DEST_QPN: c_int = 1 << 20;

// enum ibv_access_flags
pub(crate) const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub(crate) const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub(crate) const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;

// enum ibv_wr_opcode
pub(crate) const IBV_WR_RDMA_WRITE: c_uint = 0;
pub(crate) const IBV_WR_RDMA_READ: c_uint = 4;

// enum ibv_send_flags
pub(crate) const IBV_SEND_SIGNALED: c_uint = 1 << 1;

// enum ibv_wc_status
pub(crate) const IBV_WC_SUCCESS: c_uint = 0;
pub(crate) const IBV_WC_WR_FLUSH_ERR: c_uint = 5;
pub(crate) const IBV_WC_REM_INV_REQ_ERR: c_uint = 9;
pub(crate) const IBV_WC_REM_ACCESS_ERR: c_uint = 10;
pub(crate) const IBV_WC_RETRY_EXC_ERR: c_uint = 12;
pub(crate) const IBV_WC_RNR_RETRY_EXC_ERR: c_uint = 13;

// enum ibv_port_state
pub(crate) const IBV_PORT_ACTIVE: c_uint = 4;

// the anonymous link-layer enum
pub(crate) const IBV_LINK_LAYER_ETHERNET: u8 = 2;

// enum ibv_mtu
pub(crate) const IBV_MTU_256: c_uint = 1;
pub(crate) const IBV_MTU_4096: c_uint = 5;

/// `struct ibv_device`: opaque here (only passed back to the library).
#[repr(C)]
pub(crate) struct ibv_device {
    _opaque: [u8; 0],
}

/// `struct ibv_pd`: opaque here.
#[repr(C)]
pub(crate) struct ibv_pd {
    _opaque: [u8; 0],
}

/// A retired or unused slot of the ops table.
type Slot = *mut c_void;

/// `ibv_context_ops.poll_cq`.
pub(crate) type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
/// `ibv_context_ops.post_send`.
pub(crate) type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;

/// `struct ibv_context_ops`: 32 function pointers; slot 11 is `poll_cq`, slot 25
/// `post_send`.
#[repr(C)]
pub(crate) struct ibv_context_ops {
    /// `_compat_query_device` .. `_compat_create_cq` (slots 0..=10).
    _slots_0_10: [Slot; 11],
    /// `poll_cq` (slot 11).
    pub(crate) poll_cq: Option<PollCqFn>,
    /// `req_notify_cq` .. `_compat_destroy_qp` (slots 12..=24).
    _slots_12_24: [Slot; 13],
    /// `post_send` (slot 25).
    pub(crate) post_send: Option<PostSendFn>,
    /// `post_recv`, then `_compat_create_ah` .. `_compat_async_event` (slots 26..=31).
    _slots_26_31: [Slot; 6],
}

/// `struct ibv_context`.
#[repr(C)]
pub(crate) struct ibv_context {
    pub(crate) device: *mut ibv_device,
    pub(crate) ops: ibv_context_ops,
    pub(crate) cmd_fd: c_int,
    pub(crate) async_fd: c_int,
    pub(crate) num_comp_vectors: c_int,
    pub(crate) mutex: libc::pthread_mutex_t,
    pub(crate) abi_compat: *mut c_void,
}

/// `struct ibv_cq`, up to `cqe` (the rest is a mutex and counters the library owns).
#[repr(C)]
pub(crate) struct ibv_cq {
    pub(crate) context: *mut ibv_context,
    pub(crate) channel: *mut c_void,
    pub(crate) cq_context: *mut c_void,
    pub(crate) handle: u32,
    pub(crate) cqe: c_int,
}

/// `struct ibv_qp`, up to `qp_type` (the rest is a mutex and counters).
#[repr(C)]
pub(crate) struct ibv_qp {
    pub(crate) context: *mut ibv_context,
    pub(crate) qp_context: *mut c_void,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq: *mut ibv_cq,
    pub(crate) srq: *mut c_void,
    pub(crate) handle: u32,
    pub(crate) qp_num: u32,
    pub(crate) state: c_uint,
    pub(crate) qp_type: c_uint,
}

/// `struct ibv_mr`.
#[repr(C)]
pub(crate) struct ibv_mr {
    pub(crate) context: *mut ibv_context,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) addr: *mut c_void,
    pub(crate) length: usize,
    pub(crate) handle: u32,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
}

/// `union ibv_gid`: 16 bytes, aligned like its `__be64` member.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ibv_gid {
    pub(crate) raw: [u8; 16],
}

/// `struct ibv_device_attr`.
#[repr(C)]
pub(crate) struct ibv_device_attr {
    pub(crate) fw_ver: [c_char; 64],
    pub(crate) node_guid: u64,
    pub(crate) sys_image_guid: u64,
    pub(crate) max_mr_size: u64,
    pub(crate) page_size_cap: u64,
    pub(crate) vendor_id: u32,
    pub(crate) vendor_part_id: u32,
    pub(crate) hw_ver: u32,
    pub(crate) max_qp: c_int,
    pub(crate) max_qp_wr: c_int,
    pub(crate) device_cap_flags: c_uint,
    pub(crate) max_sge: c_int,
    pub(crate) max_sge_rd: c_int,
    pub(crate) max_cq: c_int,
    pub(crate) max_cqe: c_int,
    pub(crate) max_mr: c_int,
    pub(crate) max_pd: c_int,
    pub(crate) max_qp_rd_atom: c_int,
    pub(crate) max_ee_rd_atom: c_int,
    pub(crate) max_res_rd_atom: c_int,
    pub(crate) max_qp_init_rd_atom: c_int,
    pub(crate) max_ee_init_rd_atom: c_int,
    pub(crate) atomic_cap: c_uint,
    pub(crate) max_ee: c_int,
    pub(crate) max_rdd: c_int,
    pub(crate) max_mw: c_int,
    pub(crate) max_raw_ipv6_qp: c_int,
    pub(crate) max_raw_ethy_qp: c_int,
    pub(crate) max_mcast_grp: c_int,
    pub(crate) max_mcast_qp_attach: c_int,
    pub(crate) max_total_mcast_qp_attach: c_int,
    pub(crate) max_ah: c_int,
    pub(crate) max_fmr: c_int,
    pub(crate) max_map_per_fmr: c_int,
    pub(crate) max_srq: c_int,
    pub(crate) max_srq_wr: c_int,
    pub(crate) max_srq_sge: c_int,
    pub(crate) max_pkeys: u16,
    pub(crate) local_ca_ack_delay: u8,
    pub(crate) phys_port_cnt: u8,
}

/// `struct ibv_port_attr`, with spare room at the end: newer headers append fields
/// (the library never writes past the older layout through the symbol used here).
#[repr(C)]
pub(crate) struct ibv_port_attr {
    pub(crate) state: c_uint,
    pub(crate) max_mtu: c_uint,
    pub(crate) active_mtu: c_uint,
    pub(crate) gid_tbl_len: c_int,
    pub(crate) port_cap_flags: u32,
    pub(crate) max_msg_sz: u32,
    pub(crate) bad_pkey_cntr: u32,
    pub(crate) qkey_viol_cntr: u32,
    pub(crate) pkey_tbl_len: u16,
    pub(crate) lid: u16,
    pub(crate) sm_lid: u16,
    pub(crate) lmc: u8,
    pub(crate) max_vl_num: u8,
    pub(crate) sm_sl: u8,
    pub(crate) subnet_timeout: u8,
    pub(crate) init_type_reply: u8,
    pub(crate) active_width: u8,
    pub(crate) active_speed: u8,
    pub(crate) phys_state: u8,
    pub(crate) link_layer: u8,
    pub(crate) flags: u8,
    pub(crate) port_cap_flags2: u16,
    pub(crate) _spare: [u8; 64],
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_qp_cap {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    pub(crate) max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub(crate) struct ibv_qp_init_attr {
    pub(crate) qp_context: *mut c_void,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq: *mut ibv_cq,
    pub(crate) srq: *mut c_void,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) qp_type: c_uint,
    pub(crate) sq_sig_all: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_global_route {
    pub(crate) dgid: ibv_gid,
    pub(crate) flow_label: u32,
    pub(crate) sgid_index: u8,
    pub(crate) hop_limit: u8,
    pub(crate) traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_ah_attr {
    pub(crate) grh: ibv_global_route,
    pub(crate) dlid: u16,
    pub(crate) sl: u8,
    pub(crate) src_path_bits: u8,
    pub(crate) static_rate: u8,
    pub(crate) is_global: u8,
    pub(crate) port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_qp_attr {
    pub(crate) qp_state: c_uint,
    pub(crate) cur_qp_state: c_uint,
    pub(crate) path_mtu: c_uint,
    pub(crate) path_mig_state: c_uint,
    pub(crate) qkey: u32,
    pub(crate) rq_psn: u32,
    pub(crate) sq_psn: u32,
    pub(crate) dest_qp_num: u32,
    pub(crate) qp_access_flags: c_uint,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) ah_attr: ibv_ah_attr,
    pub(crate) alt_ah_attr: ibv_ah_attr,
    pub(crate) pkey_index: u16,
    pub(crate) alt_pkey_index: u16,
    pub(crate) en_sqd_async_notify: u8,
    pub(crate) sq_draining: u8,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
    pub(crate) min_rnr_timer: u8,
    pub(crate) port_num: u8,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) alt_port_num: u8,
    pub(crate) alt_timeout: u8,
    pub(crate) rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_sge {
    pub(crate) addr: u64,
    pub(crate) length: u32,
    pub(crate) lkey: u32,
}

/// The `rdma` member of `ibv_send_wr`'s `wr` union; the reserved words give the union
/// its C size (that of its largest member, `atomic`: 32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_rdma_wr {
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) _rest_of_union: [u32; 5],
}

/// `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_send_wr {
    pub(crate) wr_id: u64,
    pub(crate) next: *mut ibv_send_wr,
    pub(crate) sg_list: *mut ibv_sge,
    pub(crate) num_sge: c_int,
    pub(crate) opcode: c_uint,
    pub(crate) send_flags: c_uint,
    /// The `imm_data` / `invalidate_rkey` union.
    pub(crate) imm_data: u32,
    /// The `wr` union, as its `rdma` member.
    pub(crate) rdma: ibv_rdma_wr,
    /// The `qp_type` union (`xrc.remote_srqn`).
    pub(crate) remote_srqn: u32,
    /// The last, anonymous union (`bind_mw` / `tso`): 48 bytes, 8-aligned.
    pub(crate) _bind_mw_or_tso: [u64; 6],
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_wc {
    pub(crate) wr_id: u64,
    pub(crate) status: c_uint,
    pub(crate) opcode: c_uint,
    pub(crate) vendor_err: u32,
    pub(crate) byte_len: u32,
    /// The `imm_data` / `invalidated_rkey` union.
    pub(crate) imm_data: u32,
    pub(crate) qp_num: u32,
    pub(crate) src_qp: u32,
    pub(crate) wc_flags: c_uint,
    pub(crate) pkey_index: u16,
    pub(crate) slid: u16,
    pub(crate) sl: u8,
    pub(crate) dlid_path_bits: u8,
}

macro_rules! zeroed_default {
    ($($name:ident),* $(,)?) => {
        $(
            impl Default for $name {
                fn default() -> Self {
                    // SAFETY: a C struct of integers, byte arrays and nullable
                    // pointers, for which all-zero bytes are a valid value.
                    unsafe { std::mem::zeroed() }
                }
            }
        )*
    };
}

zeroed_default!(
    ibv_device_attr,
    ibv_port_attr,
    ibv_qp_init_attr,
    ibv_send_wr
);

macro_rules! library {
    ($($field:ident = $symbol:literal : fn($($arg:ty),*) -> $ret:ty;)*) => {
        /// The functions of libibverbs this backend calls, found by name at run time.
        pub(crate) struct Lib {
            $(pub(crate) $field: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        impl Lib {
            /// Finds every function in the library `handle`.
            ///
            /// # Safety
            ///
            /// `handle` must come from `dlopen` and never be closed.
            unsafe fn resolve(handle: *mut c_void) -> Result<Self, IbvError> {
                Ok(Self {
                    $($field: {
                        let name = concat!($symbol, "\0");
                        // SAFETY: the caller gives a live handle; the name is
                        // NUL-terminated.
                        let address = unsafe { libc::dlsym(handle, name.as_ptr().cast()) };
                        if address.is_null() {
                            return Err(IbvError::MissingSymbol { symbol: $symbol });
                        }
                        // SAFETY: the symbol is the C function declared in verbs.h with
                        // exactly this signature (see the module docs); function and
                        // data pointers have the same size on the supported targets.
                        unsafe {
                            std::mem::transmute::<
                                *mut c_void,
                                unsafe extern "C" fn($($arg),*) -> $ret,
                            >(address)
                        }
                    },)*
                })
            }
        }
    };
}

library! {
    get_device_list = "ibv_get_device_list": fn(*mut c_int) -> *mut *mut ibv_device;
    free_device_list = "ibv_free_device_list": fn(*mut *mut ibv_device) -> ();
    get_device_name = "ibv_get_device_name": fn(*mut ibv_device) -> *const c_char;
    open_device = "ibv_open_device": fn(*mut ibv_device) -> *mut ibv_context;
    close_device = "ibv_close_device": fn(*mut ibv_context) -> c_int;
    query_device = "ibv_query_device": fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
    query_port = "ibv_query_port": fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
    query_gid = "ibv_query_gid": fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;
    alloc_pd = "ibv_alloc_pd": fn(*mut ibv_context) -> *mut ibv_pd;
    reg_mr = "ibv_reg_mr": fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
    dereg_mr = "ibv_dereg_mr": fn(*mut ibv_mr) -> c_int;
    create_cq = "ibv_create_cq":
        fn(*mut ibv_context, c_int, *mut c_void, *mut c_void, c_int) -> *mut ibv_cq;
    destroy_cq = "ibv_destroy_cq": fn(*mut ibv_cq) -> c_int;
    create_qp = "ibv_create_qp": fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
    modify_qp = "ibv_modify_qp": fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
    destroy_qp = "ibv_destroy_qp": fn(*mut ibv_qp) -> c_int;
    wc_status_str = "ibv_wc_status_str": fn(c_uint) -> *const c_char;
}

impl std::fmt::Debug for Lib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lib(libibverbs.so.1)")
    }
}

/// Why the library could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LoadError {
    /// `dlopen` failed (its message).
    Missing(String),
    /// The library lacks a function.
    Incomplete(IbvError),
}

impl Lib {
    /// The library, loaded once per process and never unloaded (so the function
    /// pointers stay valid for ever).
    pub(crate) fn get() -> Result<&'static Lib, LoadError> {
        static LIB: OnceLock<Result<Lib, LoadError>> = OnceLock::new();
        LIB.get_or_init(Self::load).as_ref().map_err(Clone::clone)
    }

    fn load() -> Result<Lib, LoadError> {
        let name = CString::new(LIBRARY).map_err(|e| LoadError::Missing(e.to_string()))?;
        // SAFETY: dlopen with a NUL-terminated name; loading libibverbs runs only its
        // own initializers, which have no preconditions.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(LoadError::Missing(dl_error()));
        }
        // SAFETY: the handle is live and is never closed (it is dropped without
        // dlclose, keeping the library mapped for the rest of the process).
        unsafe { Self::resolve(handle) }.map_err(LoadError::Incomplete)
    }

    /// The name of a work-completion status, as the library spells it.
    pub(crate) fn status_name(&self, status: c_uint) -> String {
        // SAFETY: ibv_wc_status_str accepts any value and returns a static string
        // (or NULL, checked).
        let name = unsafe { (self.wc_status_str)(status) };
        if name.is_null() {
            return format!("status {status}");
        }
        // SAFETY: a NUL-terminated static string owned by the library.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }
}

/// The last `dlerror` message.
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl*
    // call on this thread; it is copied at once.
    let message = unsafe { libc::dlerror() };
    if message.is_null() {
        return "unknown dlopen error".to_string();
    }
    // SAFETY: see above.
    unsafe { CStr::from_ptr(message) }
        .to_string_lossy()
        .into_owned()
}

/// `errno` as an I/O error, for calls that return NULL and set it.
pub(crate) fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// `errno`, for calls that return NULL and set it.
pub(crate) fn errno_code() -> c_int {
    errno().raw_os_error().unwrap_or(0)
}

/// A verbs return code as an errno: rdma-core returns errno values, older libraries
/// sometimes their negatives, and some set errno and return -1.
pub(crate) fn rc_code(rc: c_int) -> c_int {
    if rc == -1 {
        let e = errno_code();
        if e != 0 {
            return e;
        }
    }
    rc.saturating_abs()
}

/// A verbs return code as an I/O error (see [`rc_code`]).
pub(crate) fn rc_error(rc: c_int) -> std::io::Error {
    std::io::Error::from_raw_os_error(rc_code(rc))
}
