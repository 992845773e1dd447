//! What the operating system says about this process and this machine: `/proc` on
//! Linux (zeros elsewhere), and GPUs through NVML, loaded with `dlopen` at run time when
//! `libnvidia-ml.so.1` is present (nothing is needed to build, and a machine without it
//! reports no GPUs).

use hyperactor::sync::Mutex;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;
use std::time::Instant;

use super::{GpuProcRecord, GpuRecord};

/// This process, from `/proc/self`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcStats {
    /// Resident memory, bytes.
    pub rss: u64,
    /// CPU time (user + system), seconds.
    pub cpu_s: f64,
    /// CPU use since the previous call (the first: since the process started), percent.
    pub cpu_pct: f64,
    /// Threads.
    pub threads: u64,
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).unwrap_or(4096)
}

/// The fields of `/proc/<pid>/stat` after the command name (field 3 first).
fn stat_fields(pid: &str) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    Some(after.split_whitespace().map(str::to_string).collect())
}

fn field(fields: &[String], n: usize) -> f64 {
    // Field n (1-based, as in proc(5)) is at n - 3 after the command name.
    fields
        .get(n.wrapping_sub(3))
        .and_then(|f| f.parse().ok())
        .unwrap_or(0.0)
}

/// This process's stats now.
pub fn proc_stats() -> ProcStats {
    static LAST: OnceLock<Mutex<Option<(Instant, f64)>>> = OnceLock::new();
    let Some(fields) = stat_fields("self") else {
        return ProcStats::default();
    };
    let ticks = clock_ticks();
    let cpu_s = (field(&fields, 14) + field(&fields, 15)) / ticks;
    let threads = field(&fields, 20) as u64;
    let rss = field(&fields, 24) as u64 * page_size();
    let now = Instant::now();
    let mut last = LAST.get_or_init(Mutex::default).lock();
    let cpu_pct = match *last {
        Some((then, before)) => {
            let wall = now.saturating_duration_since(then).as_secs_f64();
            if wall > 0.0 {
                (cpu_s - before).max(0.0) / wall * 100.0
            } else {
                0.0
            }
        }
        None => {
            let uptime: f64 = std::fs::read_to_string("/proc/uptime")
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok())
                .unwrap_or(0.0);
            let age = uptime - field(&fields, 22) / ticks;
            if age > 0.0 {
                cpu_s / age * 100.0
            } else {
                0.0
            }
        }
    };
    *last = Some((now, cpu_s));
    ProcStats {
        rss,
        cpu_s,
        cpu_pct,
        threads,
    }
}

/// This machine.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostStats {
    /// Its name.
    pub hostname: String,
    /// Load averages.
    pub load: [f64; 3],
    /// CPUs.
    pub cpus: usize,
    /// Memory, bytes.
    pub mem_total: u64,
    /// Memory available, bytes.
    pub mem_available: u64,
}

/// This machine's stats now.
pub fn host_stats() -> HostStats {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let mut load = [0.0; 3];
    if let Ok(text) = std::fs::read_to_string("/proc/loadavg") {
        for (slot, value) in load.iter_mut().zip(text.split_whitespace()) {
            *slot = value.parse().unwrap_or(0.0);
        }
    }
    let mut mem_total = 0;
    let mut mem_available = 0;
    if let Ok(text) = std::fs::read_to_string("/proc/meminfo") {
        for line in text.lines() {
            let mut parts = line.split_whitespace();
            let (Some(key), Some(kb)) = (parts.next(), parts.next()) else {
                continue;
            };
            let bytes = kb.parse::<u64>().unwrap_or(0) * 1024;
            match key {
                "MemTotal:" => mem_total = bytes,
                "MemAvailable:" => mem_available = bytes,
                _ => {}
            }
        }
    }
    HostStats {
        hostname,
        load,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        mem_total,
        mem_available,
    }
}

/// The `oom_kill` count of this process's cgroup (v2 `memory.events`), if readable.
pub fn oom_kills() -> Option<u64> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let events =
        std::fs::read_to_string(format!("/sys/fs/cgroup{}/memory.events", path.trim())).ok()?;
    events
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

// NVML, loaded at run time.

type NvmlReturn = c_int;
type NvmlDevice = *mut c_void;

#[repr(C)]
#[derive(Default)]
struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlMemory_v2_t`: `used` leaves out the memory the driver reserves (as
/// `nvidia-smi` shows it).
#[repr(C)]
#[derive(Default)]
struct NvmlMemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
#[derive(Default)]
struct NvmlUtilization {
    gpu: c_uint,
    memory: c_uint,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct NvmlProcessInfo {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

struct Nvml {
    count: unsafe extern "C" fn(*mut c_uint) -> NvmlReturn,
    handle: unsafe extern "C" fn(c_uint, *mut NvmlDevice) -> NvmlReturn,
    name: unsafe extern "C" fn(NvmlDevice, *mut c_char, c_uint) -> NvmlReturn,
    memory: unsafe extern "C" fn(NvmlDevice, *mut NvmlMemory) -> NvmlReturn,
    memory_v2: Option<unsafe extern "C" fn(NvmlDevice, *mut NvmlMemoryV2) -> NvmlReturn>,
    utilization: unsafe extern "C" fn(NvmlDevice, *mut NvmlUtilization) -> NvmlReturn,
    processes:
        Option<unsafe extern "C" fn(NvmlDevice, *mut c_uint, *mut NvmlProcessInfo) -> NvmlReturn>,
}

// SAFETY: the function pointers are plain C entry points of a library that stays loaded
// for the life of the process; NVML's functions are thread safe.
unsafe impl Send for Nvml {}
// SAFETY: as above.
unsafe impl Sync for Nvml {}

/// Looks up `name` in `lib` as a function pointer of type `T`.
///
/// # Safety
///
/// `T` must be the function pointer type of that symbol.
unsafe fn symbol<T: Copy>(lib: *mut c_void, name: &CStr) -> Option<T> {
    // SAFETY: `lib` is a handle from dlopen; `name` is NUL-terminated.
    let ptr = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees `T` is the symbol's function pointer type, which has
    // the size of a pointer.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&ptr) })
}

fn nvml() -> Option<&'static Nvml> {
    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    NVML.get_or_init(|| {
        // SAFETY: dlopen with a NUL-terminated name; the library is never closed.
        let lib = unsafe { libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_NOW) };
        if lib.is_null() {
            return None;
        }
        // SAFETY: each type below is the documented signature of that NVML function.
        unsafe {
            let init: unsafe extern "C" fn() -> NvmlReturn = symbol(lib, c"nvmlInit_v2")?;
            if init() != 0 {
                return None;
            }
            Some(Nvml {
                count: symbol(lib, c"nvmlDeviceGetCount_v2")?,
                handle: symbol(lib, c"nvmlDeviceGetHandleByIndex_v2")?,
                name: symbol(lib, c"nvmlDeviceGetName")?,
                memory: symbol(lib, c"nvmlDeviceGetMemoryInfo")?,
                memory_v2: symbol(lib, c"nvmlDeviceGetMemoryInfo_v2"),
                utilization: symbol(lib, c"nvmlDeviceGetUtilizationRates")?,
                processes: symbol(lib, c"nvmlDeviceGetComputeRunningProcesses_v3"),
            })
        }
    })
    .as_ref()
}

/// This machine's GPUs (empty without NVML).
pub fn gpus() -> Vec<GpuRecord> {
    let Some(nvml) = nvml() else {
        return Vec::new();
    };
    let mut count: c_uint = 0;
    // SAFETY: NVML is initialized; `count` is a valid out pointer.
    if unsafe { (nvml.count)(&mut count) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for index in 0..count {
        let mut device: NvmlDevice = std::ptr::null_mut();
        // SAFETY: a valid index and out pointer.
        if unsafe { (nvml.handle)(index, &mut device) } != 0 {
            continue;
        }
        let mut name = [0 as c_char; 96];
        // SAFETY: the buffer has the length given; NVML NUL-terminates it.
        let name = if unsafe { (nvml.name)(device, name.as_mut_ptr(), 96) } == 0 {
            // SAFETY: NUL-terminated by NVML within the buffer.
            unsafe { CStr::from_ptr(name.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        } else {
            String::new()
        };
        let mut memory = NvmlMemory::default();
        let mut v2 = NvmlMemoryV2 {
            // NVML_STRUCT_VERSION(Memory, 2): the struct's size and the version in the
            // top byte.
            version: std::mem::size_of::<NvmlMemoryV2>() as c_uint | (2 << 24),
            ..NvmlMemoryV2::default()
        };
        // SAFETY: a valid device and out pointer to the versioned struct.
        let v2_ok = nvml
            .memory_v2
            .is_some_and(|f| unsafe { f(device, &mut v2) } == 0);
        if v2_ok {
            memory.total = v2.total;
            memory.used = v2.used;
        } else {
            // SAFETY: a valid device and out pointer.
            let _ = unsafe { (nvml.memory)(device, &mut memory) };
        }
        let mut util = NvmlUtilization::default();
        // SAFETY: a valid device and out pointer.
        let _ = unsafe { (nvml.utilization)(device, &mut util) };
        let mut procs = Vec::new();
        if let Some(processes) = nvml.processes {
            let mut infos = [NvmlProcessInfo::default(); 64];
            let mut n: c_uint = 64;
            // SAFETY: `infos` holds `n` entries of the v3 layout.
            if unsafe { processes(device, &mut n, infos.as_mut_ptr()) } == 0 {
                procs = infos
                    .iter()
                    .take(n as usize)
                    .map(|p| GpuProcRecord {
                        pid: p.pid,
                        mem_used: p.used_gpu_memory,
                    })
                    .collect();
            }
        }
        out.push(GpuRecord {
            index,
            name,
            mem_total: memory.total,
            mem_used: memory.used,
            util_pct: f64::from(util.gpu),
            procs,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_and_machine() {
        let p = proc_stats();
        assert!(p.rss > 0 && p.threads >= 1, "{p:?}");
        let h = host_stats();
        assert!(
            h.cpus >= 1 && h.mem_total >= h.mem_available && h.mem_total > 0,
            "{h:?}"
        );
        // Without NVML this is empty; with it, every GPU has a name.
        assert!(gpus().iter().all(|g| !g.name.is_empty()));
    }

    /// Prints this machine's GPUs as NVML reports them (for a check on a GPU machine).
    #[test]
    #[ignore = "prints what NVML says; run it on a GPU machine"]
    fn print_gpus() {
        let gpus = gpus();
        println!("GPUS {}", serde_json::to_string(&gpus).unwrap_or_default());
        assert!(!gpus.is_empty(), "no GPU found through NVML");
        for g in &gpus {
            assert!(g.mem_total > 0 && g.mem_used <= g.mem_total, "{g:?}");
            assert!((0.0..=100.0).contains(&g.util_pct), "{g:?}");
        }
    }
}
