//! The device a process opened, its connections (one queue pair per owner) and the
//! transfers posted on them.

use super::*;

/// A queue pair and its completion queue; destroyed on drop.
#[derive(Debug)]
pub(super) struct Conn {
    pub(super) lib: &'static Lib,
    pub(super) qp: *mut sys::ibv_qp,
    pub(super) cq: *mut sys::ibv_cq,
}

// SAFETY: the queue pair and completion queue are plain handles to library objects;
// libibverbs' calls are thread-safe, and a connection is used by one thread at a time
// (it lives behind a mutex).
unsafe impl Send for Conn {}

impl Drop for Conn {
    fn drop(&mut self) {
        if !self.qp.is_null() {
            // SAFETY: a queue pair created by ibv_create_qp and destroyed once.
            unsafe { (self.lib.destroy_qp)(self.qp) };
        }
        if !self.cq.is_null() {
            // SAFETY: a completion queue created by ibv_create_cq, destroyed once,
            // after the queue pair using it.
            unsafe { (self.lib.destroy_cq)(self.cq) };
        }
    }
}

impl Conn {
    pub(super) fn qp_num(&self) -> u32 {
        // SAFETY: a live queue pair; qp_num is set at creation and never changes.
        unsafe { (*self.qp).qp_num }
    }

    pub(super) fn modify(
        &self,
        (mut attr, mask): (ibv_qp_attr, c_int),
        what: &str,
    ) -> Result<(), RdmaError> {
        // SAFETY: a live queue pair and a fully initialized attribute struct that
        // outlives the call.
        let rc = unsafe { (self.lib.modify_qp)(self.qp, &mut attr, mask) };
        if rc != 0 {
            return Err(verbs(
                format!("ibv_modify_qp ({what})"),
                sys::rc_error(rc).to_string(),
            ));
        }
        Ok(())
    }

    /// Posts one signaled RDMA work request.
    pub(super) fn post(
        &self,
        job: &Job,
        (offset, len): (usize, usize),
        wr_id: u64,
    ) -> std::io::Result<()> {
        let length =
            u32::try_from(len).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        let mut sge = sys::ibv_sge {
            addr: job.local + offset as u64,
            length,
            lkey: job.lkey,
        };
        let mut wr = sys::ibv_send_wr {
            wr_id,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: job.op.opcode(),
            send_flags: sys::IBV_SEND_SIGNALED,
            ..Default::default()
        };
        wr.rdma.remote_addr = job.remote + offset as u64;
        wr.rdma.rkey = job.rkey;
        // SAFETY: a live queue pair; its context is the process's open device, whose
        // ops table the library filled.
        let post = unsafe { (*(*self.qp).context).ops.post_send };
        let post = post.ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOSYS))?;
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the work request and its scatter entry are valid for the call (the
        // provider copies them into the send queue); the local range lies in a
        // registration held for the transfer and the caller's live buffer.
        let rc = unsafe { post(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(sys::rc_error(rc));
        }
        Ok(())
    }

    /// Takes up to `wcs.len()` completions.
    pub(super) fn poll(&self, wcs: &mut [ibv_wc]) -> std::io::Result<usize> {
        // SAFETY: a live completion queue whose context is the open device.
        let poll = unsafe { (*(*self.cq).context).ops.poll_cq };
        let poll = poll.ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOSYS))?;
        let room = c_int::try_from(wcs.len()).unwrap_or(c_int::MAX);
        // SAFETY: `wcs` has room for `room` completions.
        let n = unsafe { poll(self.cq, room, wcs.as_mut_ptr()) };
        usize::try_from(n).map_err(|_| sys::rc_error(n))
    }

    /// Stops the connection after a failure: the queue pair goes to the error state,
    /// which flushes its outstanding work, and the flushes are collected (for at most
    /// [`ABORT_GRACE`]). The caller then destroys the connection.
    pub(super) fn abort(&self, mut outstanding: usize) {
        let attr = ibv_qp_attr {
            qp_state: sys::IBV_QPS_ERR,
            ..Default::default()
        };
        // Best effort: destroying the queue pair afterwards stops it in any case.
        let _ = self.modify((attr, sys::IBV_QP_STATE), "to ERR");
        let until = Instant::now() + ABORT_GRACE;
        let mut wcs = [ibv_wc::default(); POLL_BATCH];
        while outstanding > 0 && Instant::now() < until {
            match self.poll(&mut wcs) {
                Ok(0) => std::thread::yield_now(),
                Ok(n) => outstanding = outstanding.saturating_sub(n),
                Err(_) => break,
            }
        }
    }
}

/// One requester's connection to one owner.
#[derive(Debug)]
pub(super) struct Link {
    /// Sent with every connection request, so the owner replaces this link's old
    /// queue pair.
    pub(super) id: u64,
    /// A `std::sync` mutex, not one of `hyperactor::sync`'s: a panic mid-transfer
    /// poisons it, and [`lock_until`] then empties the slot (the connection's state is
    /// unknown) instead of handing the connection on.
    pub(super) conn: std::sync::Mutex<Option<Conn>>,
}

/// The direction of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Read,
    Write,
}

impl Op {
    pub(super) fn opcode(self) -> u32 {
        match self {
            Op::Read => sys::IBV_WR_RDMA_READ,
            Op::Write => sys::IBV_WR_RDMA_WRITE,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
        }
    }
}

/// What one transfer moves.
#[derive(Debug, Clone, Copy)]
pub(super) struct Job {
    pub(super) op: Op,
    pub(super) pid: u32,
    pub(super) id: u64,
    pub(super) local: u64,
    pub(super) lkey: u32,
    pub(super) remote: u64,
    pub(super) rkey: u32,
    pub(super) len: usize,
}

/// The process's device: context, protection domain, port, registrations and
/// connections. Opened once, never closed.
#[derive(Debug)]
pub(super) struct Device {
    pub(super) lib: &'static Lib,
    pub(super) name: String,
    pub(super) ctx: *mut sys::ibv_context,
    pub(super) pd: *mut sys::ibv_pd,
    pub(super) port: Port,
    pub(super) max_piece: usize,
    pub(super) sq_depth: u32,
    pub(super) rd_atomic: u8,
    pub(super) mrs: Mutex<MrCache>,
    pub(super) links: Mutex<HashMap<SocketAddr, Arc<Link>>>,
    /// The owner side's queue pairs, by the requester's link id.
    pub(super) served: Mutex<HashMap<u64, Conn>>,
}

// SAFETY: the raw pointers are handles to libibverbs objects that live for the rest
// of the process; libibverbs' calls are thread-safe, and the mutable state
// (registrations, connections) is behind mutexes.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

/// The process's device, opened on first use.
pub(super) fn device() -> Result<&'static Device, RdmaError> {
    static DEVICE: OnceLock<Result<Device, IbvError>> = OnceLock::new();
    if let Some(reason) = &probe().reason {
        return Err(RdmaError::Unavailable {
            reason: reason.clone(),
        });
    }
    DEVICE
        .get_or_init(Device::open)
        .as_ref()
        .map_err(|e| verbs("opening the RDMA device", e.to_string()))
}

pub(super) fn verbs(call: impl Into<String>, detail: impl Into<String>) -> RdmaError {
    RdmaError::Verbs {
        call: call.into(),
        detail: detail.into(),
    }
}

/// Locks a connection slot, waiting until `deadline` at most. A slot poisoned by a
/// panic mid-transfer is emptied (its connection's state is unknown).
pub(super) fn lock_until<T>(
    mutex: &std::sync::Mutex<Option<T>>,
    deadline: Option<Instant>,
) -> Option<std::sync::MutexGuard<'_, Option<T>>> {
    let mut pause = Duration::from_micros(20);
    loop {
        match mutex.try_lock() {
            Ok(guard) => return Some(guard),
            Err(TryLockError::Poisoned(e)) => {
                let mut guard = e.into_inner();
                *guard = None;
                mutex.clear_poison();
                return Some(guard);
            }
            Err(TryLockError::WouldBlock) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return None;
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(1));
            }
        }
    }
}

impl Device {
    pub(super) fn open() -> Result<Device, IbvError> {
        let lib = Lib::get().map_err(|e| match e {
            LoadError::Missing(_) => IbvError::LibraryMissing,
            LoadError::Incomplete(e) => e,
        })?;
        let wanted = wanted_device();
        let (ctx, name) = with_devices(lib, |list| {
            let chosen = match &wanted {
                Some(w) => list.iter().find(|(_, name)| name == w),
                None => list.first(),
            };
            let Some((device, name)) = chosen else {
                return Err(IbvError::NoDevice);
            };
            // SAFETY: a device of the live list.
            let ctx = unsafe { (lib.open_device)(*device) };
            if ctx.is_null() {
                return Err(IbvError::OpenDevice {
                    device: name.clone(),
                    errno: sys::errno_code(),
                });
            }
            Ok((ctx, name.clone()))
        })?;
        Self::setup(lib, ctx, name).inspect_err(|_| {
            // SAFETY: the context was opened above and nothing else uses it.
            unsafe { (lib.close_device)(ctx) };
        })
    }

    pub(super) fn setup(
        lib: &'static Lib,
        ctx: *mut sys::ibv_context,
        name: String,
    ) -> Result<Device, IbvError> {
        let mut attr = sys::ibv_device_attr::default();
        // SAFETY: an open context and a writable attribute struct of the C layout.
        let rc = unsafe { (lib.query_device)(ctx, &mut attr) };
        if rc != 0 {
            return Err(IbvError::QueryDevice {
                device: name,
                errno: sys::rc_code(rc),
            });
        }
        let (num, port_attr) = Self::active_port(lib, ctx, &name, attr.phys_port_cnt)?;
        let ethernet = port_attr.link_layer == sys::IBV_LINK_LAYER_ETHERNET;
        let gid_index = match std::env::var(GID_INDEX_ENV).ok() {
            Some(v) => v
                .trim()
                .parse::<u8>()
                .map_err(|_| IbvError::BadGidIndex { value: v.clone() })?,
            None => {
                let entries = Self::gid_table(lib, ctx, &name, num, port_attr.gid_tbl_len);
                choose_gid_index(&entries, ethernet)
            }
        };
        let gid = Self::gid(lib, ctx, num, gid_index).map_err(|errno| IbvError::QueryGid {
            device: name.clone(),
            port: num,
            index: gid_index,
            errno,
        })?;
        // SAFETY: an open context.
        let pd = unsafe { (lib.alloc_pd)(ctx) };
        if pd.is_null() {
            return Err(IbvError::AllocPd {
                device: name,
                errno: sys::errno_code(),
            });
        }
        let max_msg = match port_attr.max_msg_sz {
            0 => MAX_PIECE,
            n => (n as usize).min(MAX_PIECE),
        };
        let positive = |v: c_int| u32::try_from(v).unwrap_or(0);
        let sq_depth = SQ_DEPTH.min(positive(attr.max_qp_wr)).max(1);
        let rd = positive(attr.max_qp_rd_atom).min(positive(attr.max_qp_init_rd_atom));
        let rd_atomic = u8::try_from(rd.min(u32::from(RD_ATOMIC)))
            .unwrap_or(1)
            .max(1);
        Ok(Device {
            lib,
            name,
            ctx,
            pd,
            port: Port {
                num,
                lid: port_attr.lid,
                gid,
                gid_index,
                mtu: u8::try_from(port_attr.active_mtu).unwrap_or(1),
                link_layer: port_attr.link_layer,
            },
            max_piece: max_msg,
            sq_depth,
            rd_atomic,
            mrs: Mutex::default(),
            links: Mutex::default(),
            served: Mutex::default(),
        })
    }

    /// The first active port.
    pub(super) fn active_port(
        lib: &Lib,
        ctx: *mut sys::ibv_context,
        name: &str,
        ports: u8,
    ) -> Result<(u8, sys::ibv_port_attr), IbvError> {
        let mut states = Vec::new();
        for num in 1..=ports.max(1) {
            let mut attr = sys::ibv_port_attr::default();
            // SAFETY: an open context and a zeroed attribute buffer at least as large
            // as any layout the library writes (see sys).
            let rc = unsafe { (lib.query_port)(ctx, num, &mut attr) };
            if rc != 0 {
                states.push(PortState::QueryFailed {
                    port: num,
                    errno: sys::rc_code(rc),
                });
                continue;
            }
            if attr.state == sys::IBV_PORT_ACTIVE {
                return Ok((num, attr));
            }
            states.push(PortState::NotActive {
                port: num,
                state: attr.state,
            });
        }
        Err(IbvError::NoActivePort {
            device: name.to_string(),
            ports: states,
        })
    }

    /// The port's non-empty GID entries with their sysfs types.
    pub(super) fn gid_table(
        lib: &Lib,
        ctx: *mut sys::ibv_context,
        name: &str,
        port: u8,
        len: c_int,
    ) -> Vec<GidEntry> {
        let len = u8::try_from(len.clamp(0, 255)).unwrap_or(0);
        (0..len)
            .filter_map(|index| {
                let gid = Self::gid(lib, ctx, port, index).ok()?;
                if gid.iter().all(|&b| b == 0) {
                    return None;
                }
                let kind = std::fs::read_to_string(format!(
                    "/sys/class/infiniband/{name}/ports/{port}/gid_attrs/types/{index}"
                ))
                .ok();
                Some((index, gid, kind))
            })
            .collect()
    }

    /// The GID at `index` of `port`; the errno when the query fails.
    pub(super) fn gid(
        lib: &Lib,
        ctx: *mut sys::ibv_context,
        port: u8,
        index: u8,
    ) -> Result<[u8; 16], c_int> {
        let mut gid = sys::ibv_gid::default();
        // SAFETY: an open context and a writable 16-byte GID.
        let rc = unsafe { (lib.query_gid)(ctx, port, c_int::from(index), &mut gid) };
        if rc != 0 {
            return Err(sys::rc_code(rc));
        }
        Ok(gid.raw)
    }

    /// This side's address for a queue pair.
    pub(super) fn info(&self, qp_num: u32, psn: u32, link: u64) -> QpInfo {
        QpInfo {
            lid: self.port.lid,
            gid: self.port.gid,
            qp_num,
            psn,
            port: self.port.num,
            mtu: self.port.mtu,
            link_layer: self.port.link_layer,
            rd_atomic: self.rd_atomic,
            link,
        }
    }

    /// A new queue pair (with its own completion queue) in the INIT state.
    pub(super) fn new_conn(&self) -> Result<Conn, RdmaError> {
        let depth = c_int::try_from(self.sq_depth).unwrap_or(c_int::MAX);
        // SAFETY: an open context; no completion channel, no user context.
        let cq = unsafe {
            (self.lib.create_cq)(
                self.ctx,
                depth.saturating_add(1),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(verbs("ibv_create_cq", sys::errno().to_string()));
        }
        let mut conn = Conn {
            lib: self.lib,
            qp: std::ptr::null_mut(),
            cq,
        };
        let mut init = sys::ibv_qp_init_attr {
            send_cq: cq,
            recv_cq: cq,
            cap: sys::ibv_qp_cap {
                max_send_wr: self.sq_depth,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: 0,
            ..Default::default()
        };
        // SAFETY: the process's protection domain and a filled init struct; the
        // completion queue is live.
        conn.qp = unsafe { (self.lib.create_qp)(self.pd, &mut init) };
        if conn.qp.is_null() {
            return Err(verbs("ibv_create_qp", sys::errno().to_string()));
        }
        conn.modify(init_attr(self.port.num), "RESET to INIT")?;
        Ok(conn)
    }

    /// The requester's side of a connection to the owner at `server`.
    pub(super) fn connect(
        &self,
        server: SocketAddr,
        pid: u32,
        link: u64,
        deadline: Option<Instant>,
    ) -> Result<Conn, RdmaError> {
        let conn = self.new_conn()?;
        let psn = new_psn();
        let mine = self.info(conn.qp_num(), psn, link);
        let opts = tcp::TcpOptions {
            deadline,
            ..Default::default()
        };
        let reply = tcp::request(server, pid, KIND_IBV_CONNECT, &mine.encode(), &opts)?;
        let refused = |e: IbvError| RdmaError::Refused {
            pid,
            message: e.to_string(),
        };
        let theirs = QpInfo::decode(&reply).map_err(refused)?;
        check_compatible(&self.port, &theirs).map_err(refused)?;
        conn.modify(rtr_attr(&self.port, &theirs, self.rd_atomic), "INIT to RTR")?;
        conn.modify(
            rts_attr(psn, self.rd_atomic.min(theirs.rd_atomic)),
            "RTR to RTS",
        )?;
        Ok(conn)
    }

    /// The owner's side of a connection: a queue pair ready for `theirs`; answers
    /// with its address.
    pub(super) fn accept(&self, theirs: &QpInfo) -> Result<Vec<u8>, RdmaError> {
        check_compatible(&self.port, theirs).map_err(|e| RdmaError::Refused {
            pid: std::process::id(),
            message: e.to_string(),
        })?;
        let conn = self.new_conn()?;
        let psn = new_psn();
        conn.modify(rtr_attr(&self.port, theirs, self.rd_atomic), "INIT to RTR")?;
        conn.modify(
            rts_attr(psn, self.rd_atomic.min(theirs.rd_atomic)),
            "RTR to RTS",
        )?;
        let mine = self.info(conn.qp_num(), psn, theirs.link);
        let replaced = self.served.lock().insert(theirs.link, conn);
        drop(replaced);
        Ok(mine.encode())
    }

    pub(super) fn link(&self, server: SocketAddr) -> Arc<Link> {
        self.links
            .lock()
            .entry(server)
            .or_insert_with(|| {
                Arc::new(Link {
                    id: random_u64(),
                    conn: std::sync::Mutex::new(None),
                })
            })
            .clone()
    }

    /// Registers `[addr, addr + len)` (or reuses a registration covering it) and
    /// records it under `addr`.
    pub(super) fn register(&'static self, addr: u64, len: usize) -> Result<(u32, u32), RdmaError> {
        {
            let mut cache = self.mrs.lock();
            let found = cache
                .covering(addr, len, true)
                .or_else(|| cache.covering(addr, len, false));
            if let Some(id) = found {
                if let Some(keys) = cache.acquire(id) {
                    cache.push_handle(addr, id);
                    return Ok(keys);
                }
            }
        }
        // Registering pins the memory, which takes a while for large buffers: done
        // without holding the cache.
        let full = sys::IBV_ACCESS_LOCAL_WRITE
            | sys::IBV_ACCESS_REMOTE_READ
            | sys::IBV_ACCESS_REMOTE_WRITE;
        let mr = match self.reg_mr(addr, len, full) {
            Ok(mr) => mr,
            // Read-only memory cannot be registered for writing: serve reads only (and
            // report the first failure if that fails too).
            Err(first) => self
                .reg_mr(addr, len, sys::IBV_ACCESS_REMOTE_READ)
                .map_err(|_| first)?,
        };
        let mut cache = self.mrs.lock();
        let keys = (mr.lkey, mr.rkey);
        let id = cache.insert(mr);
        cache.push_handle(addr, id);
        Ok(keys)
    }

    /// Undoes the last [`Device::register`] of `addr`.
    pub(super) fn deregister(&self, addr: u64) -> bool {
        let popped = self.mrs.lock().pop_handle(addr);
        match popped {
            Some(last) => {
                if let Some(mr) = last {
                    self.dereg_mr(&mr);
                }
                true
            }
            None => false,
        }
    }

    pub(super) fn reg_mr(
        &self,
        addr: u64,
        len: usize,
        access: c_int,
    ) -> Result<CachedMr, RdmaError> {
        // SAFETY: registration only pins and maps the range (the kernel refuses
        // unmapped memory with an error); the callers guarantee the memory stays
        // valid while registered.
        let mr = unsafe { (self.lib.reg_mr)(self.pd, addr as *mut _, len, access) };
        if mr.is_null() {
            let e = sys::errno();
            return Err(verbs(
                "ibv_reg_mr",
                format!("{len} bytes at {addr:#x} on {}: {e}", self.name),
            ));
        }
        // SAFETY: a live registration returned by ibv_reg_mr.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(CachedMr {
            mr,
            start: addr,
            len,
            lkey,
            rkey,
            writable: access & sys::IBV_ACCESS_LOCAL_WRITE != 0,
            refs: 0,
        })
    }

    pub(super) fn dereg_mr(&self, mr: &CachedMr) {
        // SAFETY: a registration from ibv_reg_mr, removed from the cache, so
        // deregistered once.
        unsafe { (self.lib.dereg_mr)(mr.mr) };
    }

    /// The registration a transfer uses for its local buffer.
    pub(super) fn local_mr(
        &'static self,
        addr: u64,
        len: usize,
        need_write: bool,
    ) -> Result<LocalMr, RdmaError> {
        {
            let mut cache = self.mrs.lock();
            if let Some(id) = cache.covering(addr, len, need_write) {
                if let Some((lkey, _)) = cache.acquire(id) {
                    return Ok(LocalMr {
                        device: self,
                        lkey,
                        kind: LocalKind::Cached(id),
                    });
                }
            }
        }
        let access = if need_write {
            sys::IBV_ACCESS_LOCAL_WRITE
        } else {
            0
        };
        let mr = self.reg_mr(addr, len, access)?;
        Ok(LocalMr {
            device: self,
            lkey: mr.lkey,
            kind: LocalKind::Temporary(mr),
        })
    }

    /// Moves `job` over `conn`, piece by piece.
    pub(super) fn run(
        &self,
        conn: &Conn,
        job: &Job,
        deadline: Option<Instant>,
        start: Instant,
    ) -> Result<(), RdmaError> {
        let pieces: Vec<(usize, usize)> = pieces(job.len, self.max_piece).collect();
        let window = self.sq_depth as usize;
        let (mut next, mut outstanding, mut finished) = (0usize, 0usize, 0usize);
        let mut wcs = [ibv_wc::default(); POLL_BATCH];
        let mut idle = 0u32;
        let failure = 'pump: loop {
            while outstanding < window && next < pieces.len() {
                if let Err(e) = conn.post(job, pieces[next], next as u64) {
                    break 'pump Some(verbs("ibv_post_send", e.to_string()));
                }
                next += 1;
                outstanding += 1;
            }
            if finished == pieces.len() {
                break None;
            }
            let got = match conn.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => break Some(verbs("ibv_poll_cq", e.to_string())),
            };
            let mut failed = None;
            for wc in &wcs[..got] {
                outstanding = outstanding.saturating_sub(1);
                finished += 1;
                if wc.status != sys::IBV_WC_SUCCESS && failed.is_none() {
                    let name = self.lib.status_name(wc.status);
                    failed = Some(completion_error(job, wc.status, wc.vendor_err, name));
                }
            }
            if failed.is_some() {
                break failed;
            }
            if got > 0 {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            if idle < SPIN_POLLS {
                std::hint::spin_loop();
                continue;
            }
            if let Some(d) = deadline {
                if Instant::now() >= d {
                    break Some(RdmaError::Timeout {
                        pid: job.pid,
                        seconds: d.saturating_duration_since(start).as_secs_f64(),
                    });
                }
            }
            std::thread::yield_now();
        };
        match failure {
            None => Ok(()),
            Some(e) => {
                conn.abort(outstanding);
                Err(e)
            }
        }
    }
}

/// The error for a failed work completion.
pub(super) fn completion_error(job: &Job, status: u32, vendor_err: u32, name: String) -> RdmaError {
    let hint = match status {
        sys::IBV_WC_REM_ACCESS_ERR => {
            return RdmaError::Dropped {
                pid: job.pid,
                id: job.id,
            }
        }
        sys::IBV_WC_RETRY_EXC_ERR => {
            "the owner's queue pair did not answer: the owner exited, or the RDMA fabric \
             between the two hosts is down (check the ports with `ibv_devinfo`; on RoCE \
             try another GID index with MONARCH_RDMA_IBVERBS_GID_INDEX)"
        }
        sys::IBV_WC_RNR_RETRY_EXC_ERR => "the owner's queue pair was not ready; retry",
        sys::IBV_WC_REM_INV_REQ_ERR => {
            "the owner refused the request: the range exceeds its registration or its \
             device's limits"
        }
        sys::IBV_WC_WR_FLUSH_ERR => "the connection had already failed; retry",
        _ => "the connection to this owner was reset; retry, and report the status if it persists",
    };
    RdmaError::Completion {
        pid: job.pid,
        op: job.op.name().to_string(),
        status: name,
        vendor_err,
        hint: hint.to_string(),
    }
}

/// Splits `len` bytes into `(offset, length)` pieces of at most `max` bytes.
pub(super) fn pieces(len: usize, max: usize) -> impl Iterator<Item = (usize, usize)> {
    let max = max.max(1);
    (0..len)
        .step_by(max)
        .map(move |offset| (offset, max.min(len - offset)))
}
