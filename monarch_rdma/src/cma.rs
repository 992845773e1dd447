//! The same-host backend: one-sided copies between two processes' memory with
//! cross-memory attach (`process_vm_readv` / `process_vm_writev`, Linux).
//!
//! The kernel copies straight between the two address spaces; no thread of the owner
//! takes part, so a busy or blocked owner does not slow a transfer. Access follows the
//! kernel's ptrace rules: a process may reach another of the same user, unless Yama's
//! `ptrace_scope` is 1 or more, where only descendants are reachable — an owner then
//! calls [`allow_peer_access`] once (monarch procs do at start).
//!
//! A copy is split into pieces of at most [`MAX_PIECE`] bytes (a system call moves at
//! most about 2 GiB) and repeated until every byte moved: the kernel may copy less than
//! asked, e.g. at a page it cannot reach, and then the next call reports why.

use std::io;

use crate::error::RdmaError;
use crate::region::{RemoteRegion, Slot, SLOT_BYTES};

/// The most bytes one system call is asked to move.
pub const MAX_PIECE: usize = 1 << 30;

/// Lets processes of the same user reach this process's registered memory even when
/// Yama's `ptrace_scope` restricts it to descendants (`PR_SET_PTRACER_ANY`). A no-op
/// where Yama is absent.
///
/// # Errors
///
/// The OS error when the setting is refused (other than by Yama's absence).
pub fn allow_peer_access() -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl(PR_SET_PTRACER) only sets a flag of the calling process.
        let rc = unsafe {
            libc::prctl(
                libc::PR_SET_PTRACER,
                libc::PR_SET_PTRACER_ANY as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            // EINVAL: the kernel has no Yama, so nothing restricts access.
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Copies `remote` (memory of process `remote.pid`) into `local`.
///
/// Before copying, the registration's slot is read from the owner (REG-4 of
/// [`crate::region`]): a dropped registration is refused instead of copying memory
/// the owner may have reused. (A registration dropped *during* a copy is not
/// detected: the owner must not drop memory that is being transferred.)
///
/// # Errors
///
/// [`RdmaError::SizeMismatch`] if the lengths differ; [`RdmaError::Dropped`] if the
/// registration ended; [`RdmaError::OwnerGone`], [`RdmaError::AccessDenied`],
/// [`RdmaError::BadAddress`] or [`RdmaError::Os`] from the kernel.
pub fn read(remote: &RemoteRegion, local: &mut [u8]) -> Result<(), RdmaError> {
    remote.check_len(local.len())?;
    check_live(remote)?;
    split(remote, local.as_mut_ptr(), local.len(), Direction::Read)
}

/// Checks that `remote`'s registration is still live in its owner, by reading the
/// registration's slot (REG-4). Skipped for regions without a slot.
///
/// # Errors
///
/// [`RdmaError::Dropped`] if it ended; the kernel's errors as in [`read`].
pub fn check_live(remote: &RemoteRegion) -> Result<(), RdmaError> {
    if remote.slot == 0 {
        return Ok(());
    }
    let mut bytes = [0u8; SLOT_BYTES];
    let slot = RemoteRegion {
        addr: remote.slot,
        len: SLOT_BYTES,
        slot: 0,
        ..*remote
    };
    transfer(&slot, bytes.as_mut_ptr(), SLOT_BYTES, Direction::Read)?;
    let (id, addr, len) = Slot::decode(&bytes);
    let end = remote.addr.checked_add(remote.len as u64);
    let live = id == remote.id
        && addr <= remote.addr
        && end.is_some_and(|end| end <= addr.saturating_add(len));
    if live {
        Ok(())
    } else {
        Err(RdmaError::Dropped {
            pid: remote.pid,
            id: remote.id,
        })
    }
}

/// Copies `local` into `remote` (memory of process `remote.pid`).
///
/// # Errors
///
/// As [`read`].
pub fn write(remote: &RemoteRegion, local: &[u8]) -> Result<(), RdmaError> {
    remote.check_len(local.len())?;
    check_live(remote)?;
    split(
        remote,
        local.as_ptr().cast_mut(),
        local.len(),
        Direction::Write,
    )
}

/// Copies of at least this many bytes are split over several threads.
pub const PARALLEL_MIN: usize = 16 << 20;

/// How many threads a large copy uses at most.
const MAX_THREADS: usize = 4;

/// The environment variable that caps the copy threads (default: one per core, at
/// most four).
pub const THREADS_ENV: &str = "MONARCH_RDMA_CMA_THREADS";

fn max_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        std::env::var(THREADS_ENV)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(cores.min(MAX_THREADS))
            .max(1)
    })
}

/// A pointer that may cross to the copy threads: each thread touches only its own
/// disjoint piece of the caller's slice, and the scope ends before the slice's borrow.
#[derive(Clone, Copy)]
struct Local(*mut u8);
// SAFETY: see the type's docs: pieces are disjoint and outlived by the borrow.
unsafe impl Send for Local {}

/// [`transfer`], split over up to [`MAX_THREADS`] threads (one per core) when the copy
/// is large: one thread does not reach the machine's memory bandwidth.
fn split(
    remote: &RemoteRegion,
    local: *mut u8,
    len: usize,
    direction: Direction,
) -> Result<(), RdmaError> {
    let threads = max_threads().min(len / (PARALLEL_MIN / 2)).max(1);
    if threads == 1 {
        return transfer(remote, local, len, direction);
    }
    // Pieces start on page boundaries of the remote memory where possible.
    let piece = (len / threads).next_multiple_of(4096);
    let local = Local(local);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (1..threads)
            .filter(|i| i * piece < len)
            .map(|i| {
                let start = i * piece;
                let n = piece.min(len - start);
                let part = RemoteRegion {
                    addr: remote.addr + start as u64,
                    len: n,
                    ..*remote
                };
                scope.spawn(move || {
                    let local = local;
                    // SAFETY: `start + n <= len`: inside the caller's slice.
                    let at = unsafe { local.0.add(start) };
                    transfer(&part, at, n, direction)
                })
            })
            .collect();
        let first = transfer(remote, local.0, piece.min(len), direction);
        let rest = handles.into_iter().map(|h| match h.join() {
            Ok(result) => result,
            Err(_) => Err(RdmaError::Refused {
                pid: remote.pid,
                message: "a copy thread panicked".into(),
            }),
        });
        // Report the first failure in address order.
        std::iter::once(first)
            .chain(rest)
            .collect::<Result<Vec<()>, _>>()?;
        Ok(())
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Read,
    Write,
}

fn transfer(
    remote: &RemoteRegion,
    local: *mut u8,
    len: usize,
    direction: Direction,
) -> Result<(), RdmaError> {
    let pid =
        libc::pid_t::try_from(remote.pid).map_err(|_| RdmaError::OwnerGone { pid: remote.pid })?;
    let mut done = 0usize;
    while done < len {
        let piece = (len - done).min(MAX_PIECE);
        // SAFETY: `done < len`, so the offset stays inside the caller's slice.
        let start = unsafe { local.add(done) };
        let local_iov = libc::iovec {
            iov_base: start.cast(),
            iov_len: piece,
        };
        let remote_iov = libc::iovec {
            iov_base: (remote.addr + done as u64) as *mut libc::c_void,
            iov_len: piece,
        };
        // SAFETY: the local iovec lies inside the caller's slice (checked lengths); the
        // remote one is only dereferenced by the kernel, in the other process, which
        // reports EFAULT for memory it cannot reach.
        let moved = unsafe {
            match direction {
                Direction::Read => libc::process_vm_readv(pid, &local_iov, 1, &remote_iov, 1, 0),
                Direction::Write => libc::process_vm_writev(pid, &local_iov, 1, &remote_iov, 1, 0),
            }
        };
        if moved < 0 {
            return Err(os_error(remote, io::Error::last_os_error()));
        }
        if moved == 0 {
            return Err(RdmaError::BadAddress {
                pid: remote.pid,
                addr: remote.addr + done as u64,
            });
        }
        done += moved.unsigned_abs();
    }
    Ok(())
}

fn os_error(remote: &RemoteRegion, e: io::Error) -> RdmaError {
    match e.raw_os_error() {
        Some(libc::ESRCH) => RdmaError::OwnerGone { pid: remote.pid },
        Some(libc::EPERM) => RdmaError::AccessDenied { pid: remote.pid },
        Some(libc::EFAULT) => RdmaError::BadAddress {
            pid: remote.pid,
            addr: remote.addr,
        },
        _ => RdmaError::Os {
            pid: remote.pid,
            source: e,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child process (forked: same addresses, copied memory) that waits to be
    /// killed. Killed and reaped on drop.
    struct Child(libc::pid_t);

    impl Child {
        fn fork() -> Self {
            // SAFETY: the child only calls pause(2) and _exit(2), both
            // async-signal-safe, so forking a multi-threaded test process is sound.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed: {}", io::Error::last_os_error());
            if pid == 0 {
                loop {
                    // SAFETY: see above.
                    unsafe { libc::pause() };
                }
            }
            Self(pid)
        }

        fn kill(&mut self) {
            if self.0 > 0 {
                // SAFETY: our own unreaped child.
                unsafe {
                    libc::kill(self.0, libc::SIGKILL);
                    libc::waitpid(self.0, std::ptr::null_mut(), 0);
                }
                self.0 = -1;
            }
        }
    }

    impl Drop for Child {
        fn drop(&mut self) {
            self.kill();
        }
    }

    fn region_of(memory: &[u8], pid: libc::pid_t) -> RemoteRegion {
        RemoteRegion {
            pid: pid as u32,
            id: 1,
            addr: memory.as_ptr() as u64,
            len: memory.len(),
            key: 0,
            slot: 0,
        }
    }

    #[test]
    fn reads_and_writes_another_process_memory_one_sided() {
        // Unaligned start and odd length, a few pages long.
        let backing: Vec<u8> = (0..100_003u32).map(|i| (i % 251) as u8).collect();
        let memory = &backing[1..];
        let child = Child::fork();
        let remote = region_of(memory, child.0);

        let mut copy = vec![0u8; memory.len()];
        read(&remote, &mut copy).unwrap();
        assert_eq!(copy, memory);

        // Write into the child, then read the child's memory back: the parent's own
        // copy is untouched (fork copied it).
        let fresh: Vec<u8> = (0..memory.len()).map(|i| (i % 13) as u8).collect();
        write(&remote, &fresh).unwrap();
        read(&remote, &mut copy).unwrap();
        assert_eq!(copy, fresh);
        assert_eq!(backing[1], 1, "the parent's memory is its own");

        // A sub-range, one byte.
        let mut one = [0u8; 1];
        read(&remote.range(7, 1).unwrap(), &mut one).unwrap();
        assert_eq!(one[0], fresh[7]);
    }

    #[test]
    fn errors_name_the_owner_and_say_what_failed() {
        let memory = vec![1u8; 64];
        let mut child = Child::fork();
        let remote = region_of(&memory, child.0);

        let mut small = vec![0u8; 63];
        let err = read(&remote, &mut small).unwrap_err();
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

        let unmapped = RemoteRegion { addr: 8, ..remote };
        let mut dst = vec![0u8; 64];
        let err = read(&unmapped, &mut dst).unwrap_err();
        assert!(matches!(err, RdmaError::BadAddress { .. }), "{err}");

        child.kill();
        let err = read(&remote, &mut dst).unwrap_err();
        assert!(matches!(err, RdmaError::OwnerGone { .. }), "{err}");
        assert!(err.to_string().contains(&remote.pid.to_string()), "{err}");
    }

    #[test]
    fn a_dropped_registration_is_refused_and_a_live_one_is_checked() {
        use crate::region::Registry;
        let registry = Registry::new();
        let live: &'static mut [u8] = Box::leak(vec![5u8; 4096].into_boxed_slice());
        let dropped: &'static mut [u8] = Box::leak(vec![6u8; 4096].into_boxed_slice());
        let live = registry.register_slice(live).unwrap();
        let gone = registry.register_slice(dropped).unwrap();
        assert!(registry.deregister(gone.id));
        // The child is a copy of this process: the same registrations, at the same
        // addresses, with the same slots.
        let child = Child::fork();
        let live = RemoteRegion {
            pid: child.0 as u32,
            ..live
        };
        let gone = RemoteRegion {
            pid: child.0 as u32,
            ..gone
        };
        let mut dst = vec![0u8; 100];
        read(&live.range(10, 100).unwrap(), &mut dst).unwrap();
        assert!(dst.iter().all(|&b| b == 5));
        let err = read(&gone, &mut vec![0u8; 4096]).unwrap_err();
        assert!(matches!(err, RdmaError::Dropped { .. }), "{err}");
        let err = write(&gone, &[0u8; 4096]).unwrap_err();
        assert!(matches!(err, RdmaError::Dropped { .. }), "{err}");
        // A forged range beyond the registration is refused too.
        let forged = RemoteRegion {
            len: live.len + 1,
            ..live
        };
        let err = read(&forged, &mut vec![0u8; live.len + 1]).unwrap_err();
        assert!(matches!(err, RdmaError::Dropped { .. }), "{err}");
    }

    #[test]
    fn peer_access_can_be_allowed() {
        allow_peer_access().unwrap();
    }
}
