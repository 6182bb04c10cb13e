//! Devices: discovery (`ibv_get_device_list`), names, GUIDs. Opening one is `crate::open`'s
//! (`ibv_open_device`, `ibv_close_device`).

use core::ffi::{c_char, c_int};
use std::sync::OnceLock;

use crate::abi::{IBV_NODE_CA, IBV_SYSFS_NAME_MAX, IBV_TRANSPORT_IB, ibv_device};
use crate::config::{self, DeviceConfig};
use crate::errno::{ffi_ptr, guard, set_errno};
use crate::registry::{self, Kind};

/// A device: the C `ibv_device` first (so `*mut ibv_device` is `*mut Device`), then ours.
#[repr(C)]
#[derive(Debug)]
pub struct Device {
    /// What C sees.
    pub dev: ibv_device,
    /// Its configuration.
    pub cfg: DeviceConfig,
    /// Position in the device list (`ibv_get_device_index`).
    pub index: usize,
    /// The port's active width and speed ([`crate::ifmtu::link_of`]).
    pub link: crate::ifmtu::Link,
}

// SAFETY: a Device is never written after the device table is built; its only raw pointers
// (the obsolete `_ops`) are NULL.
unsafe impl Sync for Device {}
// SAFETY: as above.
unsafe impl Send for Device {}

impl Device {
    /// Node GUID in memory order (`__be64`): `02:73:6f:66` ("\x02sof") then the IPv4 address.
    pub fn guid(&self) -> u64 {
        let o = self.cfg.addr.octets();
        u64::from_ne_bytes([0x02, 0x73, 0x6f, 0x66, o[0], o[1], o[2], o[3]])
    }

    /// The GID of the device: the IPv4-mapped IPv6 address `::ffff:a.b.c.d`.
    pub fn gid(&self) -> [u8; 16] {
        self.cfg.addr.to_ipv6_mapped().octets()
    }

    /// The port's LID: the low 16 bits of the device's IPv4 address (0 when they are zero).
    ///
    /// RoCE addresses by GID, but programs written for InfiniBand (qperf, and any that
    /// exchange LIDs out of band) build address vectors from a LID without a GRH. softrdma
    /// accepts those within its /16: [`Device::addr_of_lid`] maps a LID back to an address.
    pub fn lid(&self) -> u16 {
        let o = self.cfg.addr.octets();
        u16::from_be_bytes([o[2], o[3]])
    }

    /// The IPv4 address a LID names: the device's /16 with the LID as its low 16 bits, or
    /// `None` for LID 0 (no LID) and the permissive LID 0xffff.
    pub fn addr_of_lid(&self, lid: u16) -> Option<std::net::Ipv4Addr> {
        if lid == 0 || lid == 0xffff {
            return None;
        }
        let o = self.cfg.addr.octets();
        let [hi, lo] = lid.to_be_bytes();
        Some(std::net::Ipv4Addr::new(o[0], o[1], hi, lo))
    }

    /// The sysfs-style path of this device (`ibdev_path`), which `ibv_read_sysfs_file` serves.
    pub fn ibdev_path(&self) -> String {
        format!("/sys/class/infiniband/{}", self.cfg.name)
    }

    fn new(cfg: DeviceConfig, index: usize) -> Device {
        let mut dev = ibv_device {
            _ops: crate::abi::_ibv_device_ops {
                _dummy1: core::ptr::null_mut(),
                _dummy2: core::ptr::null_mut(),
            },
            node_type: IBV_NODE_CA,
            transport_type: IBV_TRANSPORT_IB,
            name: [0; IBV_SYSFS_NAME_MAX],
            dev_name: [0; IBV_SYSFS_NAME_MAX],
            dev_path: [0; crate::abi::IBV_SYSFS_PATH_MAX],
            ibdev_path: [0; crate::abi::IBV_SYSFS_PATH_MAX],
        };
        let cfg = cfg.resolve_mtu();
        let link = crate::ifmtu::link_of(cfg.addr);
        let mut d = Device {
            dev,
            cfg,
            index,
            link,
        };
        copy_cstr(&mut dev.name, &d.cfg.name);
        // `dev_name` is the device's own name rather than the kernel's `uverbs<N>`, so that
        // `/dev/infiniband/<dev_name>` can be provided for clients that check the node exists
        // (UCX requires a readable and writable character device there; `scripts/dev-nodes`
        // makes it) without colliding with a real NIC's `uverbs<N>`.
        copy_cstr(&mut dev.dev_name, &d.cfg.name);
        copy_cstr(
            &mut dev.dev_path,
            &format!("/sys/class/infiniband_verbs/{}", d.cfg.name),
        );
        copy_cstr(&mut dev.ibdev_path, &d.ibdev_path());
        d.dev = dev;
        d
    }
}

/// Copy `s` into a C char array, truncated, NUL-terminated.
pub(crate) fn copy_cstr(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
    if let Some(z) = dst.get_mut(n) {
        *z = 0;
    }
}

struct Devices(Result<Box<[Device]>, String>);

static DEVICES: OnceLock<Devices> = OnceLock::new();

/// Every device of this process (the configuration is read once, at the first call), or the
/// reason the configuration was refused.
pub fn devices() -> Result<&'static [Device], &'static str> {
    let d = DEVICES.get_or_init(|| {
        Devices(config::load().map(|cfgs| {
            cfgs.into_iter()
                .enumerate()
                .map(|(i, c)| Device::new(c, i))
                .collect()
        }))
    });
    match &d.0 {
        Ok(v) => Ok(v),
        Err(e) => Err(e),
    }
}

/// The device `p` points to, if it is one of ours.
pub fn lookup(p: *const ibv_device) -> Option<&'static Device> {
    devices().ok()?.iter().find(|d| core::ptr::eq(&d.dev, p))
}

/// `ibv_get_device_list`: a NULL-terminated array of every device; `*num_devices` (if not
/// NULL) receives their number. NULL with errno EINVAL when the configuration is malformed
/// (the reason is printed on stderr once).
///
/// # Safety
/// `num_devices` is NULL or points to a writable `int`.
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    if !num_devices.is_null() {
        // SAFETY: the caller passes NULL or a writable int; 0 stands if the list fails.
        unsafe { *num_devices = 0 };
    }
    ffi_ptr(|| {
        let devs = match devices() {
            Ok(d) => d,
            Err(why) => {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| eprintln!("softrdma: device configuration refused: {why}"));
                return Err(libc::EINVAL);
            }
        };
        let list: Box<[*mut ibv_device]> = devs
            .iter()
            .map(|d| (&d.dev as *const ibv_device).cast_mut())
            .chain(core::iter::once(core::ptr::null_mut()))
            .collect();
        let p = Box::into_raw(list) as *mut *mut ibv_device;
        registry::insert(p, Kind::DeviceList);
        if !num_devices.is_null() {
            // SAFETY: the caller passes NULL or a writable int.
            unsafe { *num_devices = devs.len() as c_int };
        }
        Ok(p)
    })
}

/// `ibv_free_device_list`. Devices stay valid (contexts opened on them keep working); a list
/// this library did not return is ignored.
///
/// # Safety
/// `list` is NULL or was returned by `ibv_get_device_list` and not freed yet.
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    guard(
        || (),
        || {
            if !registry::remove(list, Kind::DeviceList) {
                return;
            }
            let n = devices().map(|d| d.len()).unwrap_or(0) + 1;
            // SAFETY: `list` came from `Box<[*mut ibv_device]>` of `n` entries (the device
            // table never changes) and the registry let exactly one caller claim it.
            drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(list, n)) });
        },
    )
}

/// `ibv_get_device_name`: the device's name, or NULL (errno EINVAL) for a pointer that is
/// not one of our devices.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    ffi_ptr(|| match lookup(device) {
        Some(d) => Ok(d.dev.name.as_ptr().cast_mut()),
        None => Err(libc::EINVAL),
    })
}

/// `ibv_get_device_guid`: the node GUID in network byte order; 0 (errno EINVAL) for an
/// unknown device.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    guard(
        || 0,
        || match lookup(device) {
            Some(d) => d.guid(),
            None => {
                set_errno(libc::EINVAL);
                0
            }
        },
    )
}

/// `ibv_get_device_index`: position in the list, or -1 (errno EINVAL).
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    guard(
        || -1,
        || match lookup(device) {
            Some(d) => d.index as c_int,
            None => {
                set_errno(libc::EINVAL);
                -1
            }
        },
    )
}

/// `ibv_register_driver@IBVERBS_1.1` (a compatibility symbol only: verbs.h no longer declares
/// it, and a new program cannot link it): the entry point of libibverbs 1.1-era providers,
/// which called it from their constructors. softrdma loads no providers, so it does nothing.
pub extern "C" fn ibv_register_driver(
    _name: *const c_char,
    _init_func: Option<unsafe extern "C" fn()>,
) {
}
