//! VFIO, just enough to turn a PCI device's MSI-X vector into an eventfd.
//!
//! Used by the `vm:` transport inside QEMU guests: the `ivshmem-doorbell` device signals
//! its guest only by MSI-X, and user space receives MSI-X only through `vfio-pci` (which
//! needs an IOMMU, or a kernel with `CONFIG_VFIO_NOIOMMU`). [`MsixIrq::open`] opens the
//! container (`/dev/vfio/vfio`), the device's group (`/dev/vfio/N`, from the device's
//! `iommu_group` link in sysfs) and the device, and asks for one MSI-X vector to signal an
//! eventfd (`VFIO_DEVICE_SET_IRQS` with `VFIO_IRQ_SET_DATA_EVENTFD |
//! VFIO_IRQ_SET_ACTION_TRIGGER`). Everything lives while the value does: dropping it
//! closes the device, which turns the vector off again.
//!
//! A group opens once at a time (the kernel answers `EBUSY` to a second open), so one
//! process per device owns its interrupts.
//!
//! The ioctl numbers and structures are those of `<linux/vfio.h>` (UAPI, stable).

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::{owned, syscall};

// `_IO(VFIO_TYPE, VFIO_BASE + n)`: no size or direction bits in VFIO's numbers.
const VFIO_TYPE: libc::c_ulong = b';' as libc::c_ulong;
const VFIO_BASE: libc::c_ulong = 100;
const fn vfio_io(n: libc::c_ulong) -> libc::c_ulong {
    (VFIO_TYPE << 8) | (VFIO_BASE + n)
}
const VFIO_GET_API_VERSION: libc::c_ulong = vfio_io(0);
const VFIO_CHECK_EXTENSION: libc::c_ulong = vfio_io(1);
const VFIO_SET_IOMMU: libc::c_ulong = vfio_io(2);
const VFIO_GROUP_GET_STATUS: libc::c_ulong = vfio_io(3);
const VFIO_GROUP_SET_CONTAINER: libc::c_ulong = vfio_io(4);
const VFIO_GROUP_GET_DEVICE_FD: libc::c_ulong = vfio_io(6);
const VFIO_DEVICE_GET_REGION_INFO: libc::c_ulong = vfio_io(8);
const VFIO_DEVICE_GET_IRQ_INFO: libc::c_ulong = vfio_io(9);
const VFIO_DEVICE_SET_IRQS: libc::c_ulong = vfio_io(10);

const VFIO_API_VERSION: libc::c_int = 0;
const VFIO_TYPE1_IOMMU: libc::c_ulong = 1;
const VFIO_TYPE1V2_IOMMU: libc::c_ulong = 3;
const VFIO_GROUP_FLAGS_VIABLE: u32 = 1;
const VFIO_IRQ_INFO_EVENTFD: u32 = 1;
const VFIO_IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
const VFIO_IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;
/// `VFIO_PCI_MSIX_IRQ_INDEX`.
const MSIX_INDEX: u32 = 2;
/// `VFIO_PCI_CONFIG_REGION_INDEX`: the device's configuration space.
const CONFIG_INDEX: u32 = 7;
const PCI_COMMAND: u64 = 4;
const PCI_COMMAND_MASTER: u16 = 1 << 2;

#[repr(C)]
struct RegionInfo {
    argsz: u32,
    flags: u32,
    index: u32,
    cap_offset: u32,
    size: u64,
    offset: u64,
}

#[repr(C)]
struct GroupStatus {
    argsz: u32,
    flags: u32,
}

#[repr(C)]
struct IrqInfo {
    argsz: u32,
    flags: u32,
    index: u32,
    count: u32,
}

/// `struct vfio_irq_set` followed by one eventfd (`data[]`).
#[repr(C)]
struct IrqSetOne {
    argsz: u32,
    flags: u32,
    index: u32,
    start: u32,
    count: u32,
    fd: i32,
}

fn err(kind: io::ErrorKind, what: String) -> io::Error {
    io::Error::new(kind, what)
}

/// One MSI-X vector of a `vfio-pci` device, delivered to an eventfd.
#[derive(Debug)]
pub struct MsixIrq {
    /// The PCI address (`0000:00:02.0`).
    bdf: String,
    group_no: u32,
    vector: u32,
    event: OwnedFd,
    // Kept open for the vector's lifetime; dropped device first (field order).
    _device: OwnedFd,
    _group: OwnedFd,
    _container: OwnedFd,
}

impl MsixIrq {
    /// Opens the device at `dev` (its sysfs directory, `/sys/bus/pci/devices/BDF`) through
    /// VFIO and routes MSI-X `vector` to a new eventfd ([`MsixIrq::eventfd`]).
    ///
    /// Errors: `NotFound` if the device has no IOMMU group or is not bound to `vfio-pci`,
    /// an `EBUSY` error if another process holds the group, `Unsupported` if the
    /// kernel offers no type-1 IOMMU or the device no such vector, else the failing call's
    /// error, with what was being done in the message.
    pub fn open(dev: &Path, vector: u32) -> io::Result<MsixIrq> {
        let ctx = |what: &'static str| move |e: io::Error| err(e.kind(), format!("{what}: {e}"));
        let dev = dev
            .canonicalize()
            .map_err(ctx("the device's sysfs directory"))?;
        let bdf = dev
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| err(io::ErrorKind::InvalidInput, "no PCI address".into()))?
            .to_owned();
        let driver = std::fs::read_link(dev.join("driver")).ok();
        if driver.as_deref().and_then(Path::file_name) != Some("vfio-pci".as_ref()) {
            return Err(err(
                io::ErrorKind::NotFound,
                format!("{bdf} is not bound to vfio-pci"),
            ));
        }
        let group_no: u32 = std::fs::read_link(dev.join("iommu_group"))
            .ok()
            .and_then(|g| g.file_name()?.to_str()?.parse().ok())
            .ok_or_else(|| err(io::ErrorKind::NotFound, format!("{bdf} has no IOMMU group")))?;

        let rw = |p: &Path| -> io::Result<OwnedFd> {
            Ok(OpenOptions::new().read(true).write(true).open(p)?.into())
        };
        let container = rw(Path::new("/dev/vfio/vfio")).map_err(ctx("/dev/vfio/vfio"))?;
        let group_path = PathBuf::from(format!("/dev/vfio/{group_no}"));
        let group = rw(&group_path).map_err(|e| {
            err(
                e.kind(),
                format!("{} (another process owns it?): {e}", group_path.display()),
            )
        })?;

        let c = container.as_raw_fd();
        // SAFETY: an ioctl without argument on a descriptor we own.
        let v = syscall!(ioctl(c, VFIO_GET_API_VERSION)).map_err(ctx("VFIO_GET_API_VERSION"))?;
        if v != VFIO_API_VERSION {
            return Err(err(
                io::ErrorKind::Unsupported,
                format!("VFIO API version {v}"),
            ));
        }
        // SAFETY: as above, the argument is an integer.
        let v2 = syscall!(ioctl(c, VFIO_CHECK_EXTENSION, VFIO_TYPE1V2_IOMMU)).unwrap_or(0) > 0;
        // SAFETY: as above.
        let v1 = syscall!(ioctl(c, VFIO_CHECK_EXTENSION, VFIO_TYPE1_IOMMU)).unwrap_or(0) > 0;
        let iommu = match (v2, v1) {
            (true, _) => VFIO_TYPE1V2_IOMMU,
            (false, true) => VFIO_TYPE1_IOMMU,
            _ => {
                return Err(err(
                    io::ErrorKind::Unsupported,
                    "no type-1 IOMMU in this kernel (no IOMMU, or vfio_iommu_type1 not loaded)"
                        .into(),
                ))
            }
        };

        let g = group.as_raw_fd();
        let mut st = GroupStatus {
            argsz: std::mem::size_of::<GroupStatus>() as u32,
            flags: 0,
        };
        // SAFETY: `st` is a valid vfio_group_status the kernel fills in (argsz set).
        syscall!(ioctl(g, VFIO_GROUP_GET_STATUS, &mut st as *mut GroupStatus))
            .map_err(ctx("VFIO_GROUP_GET_STATUS"))?;
        if st.flags & VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(err(
                io::ErrorKind::Unsupported,
                format!("IOMMU group {group_no} is not viable (a device in it has another driver)"),
            ));
        }
        // SAFETY: the argument points at the container's descriptor (an int), read only.
        syscall!(ioctl(g, VFIO_GROUP_SET_CONTAINER, &c as *const libc::c_int))
            .map_err(ctx("VFIO_GROUP_SET_CONTAINER"))?;
        // SAFETY: an integer argument on our container.
        syscall!(ioctl(c, VFIO_SET_IOMMU, iommu)).map_err(ctx("VFIO_SET_IOMMU"))?;
        let name = CString::new(bdf.as_str())
            .map_err(|_| err(io::ErrorKind::InvalidInput, "PCI address with a NUL".into()))?;
        // SAFETY: `name` is a NUL-terminated string the kernel only reads.
        let d = syscall!(ioctl(g, VFIO_GROUP_GET_DEVICE_FD, name.as_ptr()))
            .map_err(ctx("VFIO_GROUP_GET_DEVICE_FD"))?;
        // SAFETY: the ioctl returned a new descriptor nothing else owns.
        let device = unsafe { owned(d) };

        let mut info = IrqInfo {
            argsz: std::mem::size_of::<IrqInfo>() as u32,
            flags: 0,
            index: MSIX_INDEX,
            count: 0,
        };
        // SAFETY: `info` is a valid vfio_irq_info (argsz and index set) the kernel fills.
        syscall!(ioctl(
            device.as_raw_fd(),
            VFIO_DEVICE_GET_IRQ_INFO,
            &mut info as *mut IrqInfo
        ))
        .map_err(ctx("VFIO_DEVICE_GET_IRQ_INFO"))?;
        if info.flags & VFIO_IRQ_INFO_EVENTFD == 0 || vector >= info.count {
            return Err(err(
                io::ErrorKind::Unsupported,
                format!(
                    "{bdf}: MSI-X has {} vectors (flags {:#x}), vector {vector} wanted",
                    info.count, info.flags
                ),
            ));
        }

        // MSI-X messages are memory writes by the device: with bus mastering off (vfio-pci
        // leaves it to its user) they are dropped and no interrupt ever arrives.
        bus_master_on(device.as_fd()).map_err(ctx("enabling bus mastering"))?;

        // SAFETY: creates a new eventfd; the result is checked.
        let e =
            syscall!(eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK)).map_err(ctx("eventfd"))?;
        // SAFETY: a new descriptor nothing else owns.
        let event = unsafe { owned(e) };
        let set = IrqSetOne {
            argsz: std::mem::size_of::<IrqSetOne>() as u32,
            flags: VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
            index: MSIX_INDEX,
            start: vector,
            count: 1,
            fd: event.as_raw_fd(),
        };
        // SAFETY: `set` is a vfio_irq_set with one eventfd in its data, argsz covering it;
        // the kernel only reads it.
        syscall!(ioctl(
            device.as_raw_fd(),
            VFIO_DEVICE_SET_IRQS,
            &set as *const IrqSetOne
        ))
        .map_err(ctx("VFIO_DEVICE_SET_IRQS"))?;
        Ok(MsixIrq {
            bdf,
            group_no,
            vector,
            event,
            _device: device,
            _group: group,
            _container: container,
        })
    }

    /// The eventfd the vector signals (non-blocking; read 8 bytes to reset it).
    pub fn eventfd(&self) -> BorrowedFd<'_> {
        self.event.as_fd()
    }

    /// The device's PCI address.
    pub fn bdf(&self) -> &str {
        &self.bdf
    }

    /// The device's IOMMU group number (`/dev/vfio/N`).
    pub fn group(&self) -> u32 {
        self.group_no
    }

    /// The MSI-X vector routed to the eventfd.
    pub fn vector(&self) -> u32 {
        self.vector
    }
}

/// Sets Bus Master Enable in the command register, through the device's config region.
fn bus_master_on(device: BorrowedFd<'_>) -> io::Result<()> {
    let mut r = RegionInfo {
        argsz: std::mem::size_of::<RegionInfo>() as u32,
        flags: 0,
        index: CONFIG_INDEX,
        cap_offset: 0,
        size: 0,
        offset: 0,
    };
    // SAFETY: `r` is a valid vfio_region_info (argsz and index set) the kernel fills in.
    syscall!(ioctl(
        device.as_raw_fd(),
        VFIO_DEVICE_GET_REGION_INFO,
        &mut r as *mut RegionInfo
    ))?;
    if r.size < PCI_COMMAND + 2 {
        return Err(err(
            io::ErrorKind::InvalidData,
            format!("config region of {} bytes", r.size),
        ));
    }
    let at = (r.offset + PCI_COMMAND) as libc::off_t;
    let mut cmd = [0u8; 2];
    // SAFETY: reads 2 bytes into a live 2-byte buffer.
    let n = syscall!(pread(device.as_raw_fd(), cmd.as_mut_ptr().cast(), 2, at))?;
    if n != 2 {
        return Err(err(
            io::ErrorKind::UnexpectedEof,
            "short config read".into(),
        ));
    }
    let v = u16::from_le_bytes(cmd) | PCI_COMMAND_MASTER;
    let b = v.to_le_bytes();
    // SAFETY: writes 2 bytes from a live 2-byte buffer.
    let n = syscall!(pwrite(device.as_raw_fd(), b.as_ptr().cast(), 2, at))?;
    if n != 2 {
        return Err(err(io::ErrorKind::WriteZero, "short config write".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_linux_vfio_h() {
        // Values from <linux/vfio.h> as compiled on x86-64 (_IO(';', 100 + n)).
        assert_eq!(VFIO_GET_API_VERSION, 0x3b64);
        assert_eq!(VFIO_GROUP_GET_DEVICE_FD, 0x3b6a);
        assert_eq!(VFIO_DEVICE_SET_IRQS, 0x3b6e);
        assert_eq!(std::mem::size_of::<IrqSetOne>(), 24);
    }

    #[test]
    fn a_device_without_vfio_is_refused_cleanly() {
        let d = std::env::temp_dir().join(format!("shmlink-vfio-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let e = MsixIrq::open(&d, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert!(e.to_string().contains("not bound to vfio-pci"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
        let e = MsixIrq::open(Path::new("/nonexistent/0000:00:02.0"), 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    }
}
