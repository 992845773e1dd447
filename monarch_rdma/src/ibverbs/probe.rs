//! Finding the backend: loading libibverbs and the device this process uses, and
//! saying in words why the backend cannot be used when it cannot.

use super::*;

/// What [`probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The RDMA devices libibverbs lists (kernel names, e.g. `mlx5_0`).
    pub devices: Vec<String>,
    /// Why the backend cannot be used; `None` when it can.
    pub reason: Option<String>,
}

impl Probe {
    /// Whether the backend can be used.
    pub fn available(&self) -> bool {
        self.reason.is_none()
    }

    pub(super) fn unavailable(reason: impl Into<String>, devices: Vec<String>) -> Self {
        Self {
            devices,
            reason: Some(reason.into()),
        }
    }
}

/// Whether this process can use the backend, checked once (the environment's
/// [`DISABLE_ENV`] is read then). Never panics, whatever is installed.
pub fn probe() -> &'static Probe {
    static PROBE: OnceLock<Probe> = OnceLock::new();
    PROBE.get_or_init(|| probe_with(env_flag(std::env::var(DISABLE_ENV).ok().as_deref())))
}

/// Checks, now and without caching, whether the backend can be used; `disabled` turns
/// it off (the `rdma_disable_ibverbs` setting).
pub fn probe_with(disabled: bool) -> Probe {
    if disabled {
        return Probe::unavailable(REASON_DISABLED, Vec::new());
    }
    let lib = match Lib::get() {
        Ok(lib) => lib,
        Err(e) => return Probe::unavailable(load_reason(&e), Vec::new()),
    };
    let devices = with_devices(lib, |list| {
        list.iter()
            .map(|(_, name)| name.clone())
            .collect::<Vec<_>>()
    });
    if devices.is_empty() {
        return Probe::unavailable(REASON_NO_DEVICE, devices);
    }
    if let Some(wanted) = wanted_device() {
        if !devices.contains(&wanted) {
            let why = format!(
                "{DEVICE_ENV} names the RDMA device {wanted:?}, which does not exist \
                 (devices: {})",
                devices.join(", ")
            );
            return Probe::unavailable(why, devices);
        }
    }
    Probe {
        devices,
        reason: None,
    }
}

/// Whether an environment value turns a flag on.
pub(super) fn env_flag(value: Option<&str>) -> bool {
    matches!(
        value.map(|v| v.trim().to_ascii_lowercase()).as_deref(),
        Some("1" | "true" | "yes" | "on")
    )
}

pub(super) fn wanted_device() -> Option<String> {
    std::env::var(DEVICE_ENV)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

pub(super) fn load_reason(e: &LoadError) -> String {
    match e {
        LoadError::Missing(_) => REASON_MISSING.to_string(),
        LoadError::Incomplete(why) => why.to_string(),
    }
}

/// Calls `f` with the devices libibverbs lists (pointer and name), then frees the
/// list. An error listing them counts as no device.
pub(super) fn with_devices<R>(
    lib: &Lib,
    f: impl FnOnce(&[(*mut sys::ibv_device, String)]) -> R,
) -> R {
    let mut count: c_int = 0;
    // SAFETY: ibv_get_device_list writes the count and returns a NULL-terminated
    // array it owns, or NULL on failure.
    let list = unsafe { (lib.get_device_list)(&mut count) };
    let mut devices = Vec::new();
    if !list.is_null() {
        for i in 0..usize::try_from(count).unwrap_or(0) {
            // SAFETY: the array holds `count` device pointers.
            let device = unsafe { *list.add(i) };
            if device.is_null() {
                break;
            }
            // SAFETY: a device of the live list; the name is a NUL-terminated string
            // owned by the device (or NULL, checked).
            let name = unsafe { (lib.get_device_name)(device) };
            let name = if name.is_null() {
                format!("device{i}")
            } else {
                // SAFETY: see above.
                unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned()
            };
            devices.push((device, name));
        }
    }
    let result = f(&devices);
    if !list.is_null() {
        // SAFETY: the list came from ibv_get_device_list and is freed once; devices
        // opened by `f` stay valid (libibverbs reference-counts them).
        unsafe { (lib.free_device_list)(list) };
    }
    result
}
