//! Loop devices for image-backed volumes: attach a file in one `LOOP_CONFIGURE` call with
//! autoclear (the device frees itself when its last user, the mount, goes away), refresh the
//! size after the file grew, read a block device's size. The `loopdev` crates generate their
//! bindings with bindgen (libclang at build time), so the two structures are written out here
//! from `linux/loop.h`.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use rustix::fs::{Mode, OFlags};

const LOOP_SET_CAPACITY: u64 = 0x4C07;
const LOOP_CONFIGURE: u64 = 0x4C0A;
const LOOP_CTL_GET_FREE: u64 = 0x4C82;
/// `BLKGETSIZE64` = `_IOR(0x12, 114, size_t)`.
const BLKGETSIZE64: u64 = 0x8008_1272;
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);
const _: () = assert!(std::mem::size_of::<LoopConfig>() == 304);

/// An attached loop device, open. With autoclear, closing this (after the device was mounted)
/// leaves the mount as the device's only user; unmounting then detaches it.
#[derive(Debug)]
pub struct Loop {
    fd: OwnedFd,
    number: u32,
}

impl Loop {
    /// `/dev/loop<N>`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/dev/loop{}", self.number))
    }

    /// The device number `N`.
    pub fn number(&self) -> u32 {
        self.number
    }
}

impl AsFd for Loop {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// An ioctl whose argument is a plain integer (or nothing).
#[allow(unsafe_code)]
fn ioctl_int(fd: BorrowedFd<'_>, request: u64, arg: libc::c_ulong) -> io::Result<libc::c_int> {
    // SAFETY: `fd` is live for the call; the requests passed here take their argument by value
    // (an integer or nothing), so the kernel dereferences no pointer.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request as libc::Ioctl, arg) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Attaches `file` to a free loop device with autoclear (and read-only when asked). Retries
/// when another process takes the free device first.
#[allow(unsafe_code)]
pub fn attach(file: BorrowedFd<'_>, read_only: bool) -> io::Result<Loop> {
    let ctl = rustix::fs::open("/dev/loop-control", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
    let mut last = io::Error::from_raw_os_error(libc::EBUSY);
    for _ in 0..16 {
        let number = ioctl_int(ctl.as_fd(), LOOP_CTL_GET_FREE, 0)?;
        let number = u32::try_from(number).map_err(|_| io::Error::from_raw_os_error(libc::ERANGE))?;
        let access = if read_only { OFlags::RDONLY } else { OFlags::RDWR };
        let dev = rustix::fs::open(format!("/dev/loop{number}"), access | OFlags::CLOEXEC, Mode::empty())?;
        let mut config = LoopConfig {
            fd: u32::try_from(file.as_raw_fd()).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?,
            block_size: 0,
            info: LoopInfo64 {
                lo_device: 0,
                lo_inode: 0,
                lo_rdevice: 0,
                lo_offset: 0,
                lo_sizelimit: 0,
                lo_number: 0,
                lo_encrypt_type: 0,
                lo_encrypt_key_size: 0,
                lo_flags: LO_FLAGS_AUTOCLEAR | if read_only { LO_FLAGS_READ_ONLY } else { 0 },
                lo_file_name: [0; 64],
                lo_crypt_name: [0; 64],
                lo_encrypt_key: [0; 32],
                lo_init: [0; 2],
            },
            reserved: [0; 8],
        };
        // SAFETY: `dev` and `file` are live descriptors for the call; `config` is an initialised
        // `struct loop_config` of exactly the size the kernel copies in, and the kernel keeps
        // no pointer to it.
        let rc = unsafe {
            libc::ioctl(
                dev.as_raw_fd(),
                LOOP_CONFIGURE as libc::Ioctl,
                &mut config as *mut LoopConfig,
            )
        };
        if rc == 0 {
            return Ok(Loop { fd: dev, number });
        }
        last = io::Error::last_os_error();
        if last.raw_os_error() != Some(libc::EBUSY) {
            return Err(last);
        }
    }
    Err(last)
}

/// Makes the loop device `dev` pick up the new size of its (grown) backing file.
pub fn refresh_capacity(dev: BorrowedFd<'_>) -> io::Result<()> {
    ioctl_int(dev, LOOP_SET_CAPACITY, 0).map(|_| ())
}

/// Size in bytes of the block device open as `dev`.
#[allow(unsafe_code)]
pub fn block_device_size(dev: BorrowedFd<'_>) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: `dev` is live for the call; BLKGETSIZE64 writes one u64 to the pointer, which
    // points at `size`, a u64 that outlives the call.
    let rc = unsafe { libc::ioctl(dev.as_raw_fd(), BLKGETSIZE64 as libc::Ioctl, &mut size as *mut u64) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(size)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Attaches a 4 MiB file, checks the device's size, grows the file and refreshes, and
    /// checks the device frees itself when closed (autoclear).
    #[test]
    fn a_file_is_attached_resized_and_freed_on_last_close() {
        if !rustix::process::geteuid().is_root() || !std::path::Path::new("/dev/loop-control").exists() {
            eprintln!("skipped: needs root and /dev/loop-control");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(tmp.path().join("img"))
            .unwrap();
        file.set_len(4 << 20).unwrap();
        let dev = attach(file.as_fd(), false).unwrap();
        assert_eq!(block_device_size(dev.as_fd()).unwrap(), 4 << 20);
        file.set_len(8 << 20).unwrap();
        refresh_capacity(dev.as_fd()).unwrap();
        assert_eq!(block_device_size(dev.as_fd()).unwrap(), 8 << 20);
        let backing = format!("/sys/block/loop{}/loop/backing_file", dev.number());
        assert!(std::fs::read_to_string(&backing).unwrap().contains("img"));
        drop(dev);
        // Autoclear: after the last close the device has no backing file any more (the
        // kernel detaches it in a work item right after release).
        for _ in 0..5000 {
            if !std::path::Path::new(&backing).exists() {
                return;
            }
            std::thread::yield_now();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(!std::path::Path::new(&backing).exists(), "autoclear did not detach");
    }

    #[test]
    fn a_directory_cannot_be_attached() {
        if !rustix::process::geteuid().is_root() || !std::path::Path::new("/dev/loop-control").exists() {
            eprintln!("skipped: needs root and /dev/loop-control");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = std::fs::File::open(tmp.path()).unwrap();
        assert!(attach(dir.as_fd(), true).is_err());
    }
}
