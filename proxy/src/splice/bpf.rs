//! The kernel objects of a splice: two socket hash maps and the verdict
//! program that joins their sockets, made with the `bpf(2)` system call
//! directly. The program is sixteen instructions, written out here rather
//! than compiled from C, so the build needs no BPF toolchain and the proxy
//! no object loader.
//!
//! What a splice does with them, and when, is `splice.rs`'s business.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::libc;

/// `bpf(2)` commands (linux/bpf.h, `enum bpf_cmd`).
const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_MAP_DELETE_ELEM: libc::c_int = 3;
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_PROG_ATTACH: libc::c_int = 8;

/// `BPF_MAP_TYPE_SOCKHASH`: values are sockets, keys are ours.
const MAP_TYPE_SOCKHASH: u32 = 18;
/// `BPF_PROG_TYPE_SK_SKB`: runs on each buffer a mapped socket receives.
const PROG_TYPE_SK_SKB: u32 = 14;
/// `BPF_SK_SKB_VERDICT`: the verdict program of a map's sockets, run
/// without a stream parser (Linux 5.13 and later).
const ATTACH_SK_SKB_VERDICT: u32 = 38;
/// `BPF_ANY` for updates: create or replace.
const UPDATE_ANY: u64 = 0;

/// Helper function numbers (linux/bpf.h, `__BPF_FUNC_MAPPER`).
const HELPER_GET_SOCKET_COOKIE: i32 = 46;
const HELPER_SK_REDIRECT_HASH: i32 = 72;
/// `SK_PASS`: the verdict that keeps a buffer (redirected when a redirect
/// was set, else queued on its own socket).
const SK_PASS: i32 = 1;
/// `SK_DROP`: the verdict that frees a buffer.
const SK_DROP: i32 = 0;

/// The kernel's `struct bpf_insn`: opcode, the two registers in one byte
/// (destination in the low nibble), offset and immediate.
#[repr(C)]
#[derive(Clone, Copy)]
struct Instruction {
    code: u8,
    registers: u8,
    offset: i16,
    immediate: i32,
}

const fn instruction(code: u8, dst: u8, src: u8, offset: i16, immediate: i32) -> Instruction {
    Instruction {
        code,
        registers: (src << 4) | dst,
        offset,
        immediate,
    }
}

/// Opcodes used below (linux/bpf_common.h and bpf.h).
const MOV64_REG: u8 = 0xbf;
const MOV64_IMM: u8 = 0xb7;
const ADD64_IMM: u8 = 0x07;
const STORE_DW: u8 = 0x7b;
const LOAD_W: u8 = 0x61;
const JUMP_IF_ZERO: u8 = 0x15;
const LOAD_IMM64: u8 = 0x18;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
/// `BPF_PSEUDO_MAP_FD`: the 64-bit immediate load names a map by fd.
const PSEUDO_MAP_FD: u8 = 1;

/// The verdict program: a buffer received by a socket is sent out of the
/// socket `peers` holds under the receiving socket's cookie. When there is
/// none it stays on its own socket: a buffer is never dropped.
///
/// An empty buffer (a bare FIN) is dropped, which frees it and nothing
/// else: the FIN is in the socket's state already, and the proxy
/// propagates the close itself. Redirected or kept, it would reach the
/// kernel's queue worker, which takes an empty buffer for a broken pipe and
/// stops sending on that socket for good.
///
/// ```text
/// r6 = r1                       ; the buffer
/// r2 = *(u32 *)(r1 + 0)         ; its length
/// if r2 == 0 goto drop
/// r0 = get_socket_cookie(r1)
/// *(u64 *)(r10 - 8) = r0        ; the key, on the stack
/// r1 = r6
/// r2 = peers                    ; two instructions
/// r3 = r10 - 8
/// r4 = 0                        ; out of the peer, not into it
/// sk_redirect_hash(r1, r2, r3, r4)
/// return SK_PASS
/// drop: return SK_DROP
/// ```
fn verdict_program(peers: RawFd) -> [Instruction; 16] {
    [
        instruction(MOV64_REG, 6, 1, 0, 0),
        // `len` is the first field of `struct __sk_buff`.
        instruction(LOAD_W, 2, 1, 0, 0),
        // Over the eleven instructions up to `drop`.
        instruction(JUMP_IF_ZERO, 2, 0, 11, 0),
        instruction(CALL, 0, 0, 0, HELPER_GET_SOCKET_COOKIE),
        instruction(STORE_DW, 10, 0, -8, 0),
        instruction(MOV64_REG, 1, 6, 0, 0),
        instruction(LOAD_IMM64, 2, PSEUDO_MAP_FD, 0, peers),
        instruction(0, 0, 0, 0, 0),
        instruction(MOV64_REG, 3, 10, 0, 0),
        instruction(ADD64_IMM, 3, 0, 0, -8),
        instruction(MOV64_IMM, 4, 0, 0, 0),
        instruction(CALL, 0, 0, 0, HELPER_SK_REDIRECT_HASH),
        instruction(MOV64_IMM, 0, 0, 0, SK_PASS),
        instruction(EXIT, 0, 0, 0, 0),
        instruction(MOV64_IMM, 0, 0, 0, SK_DROP),
        instruction(EXIT, 0, 0, 0, 0),
    ]
}

/// `union bpf_attr` for `BPF_MAP_CREATE`, as far as we set it.
#[repr(C)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

/// `union bpf_attr` for `BPF_PROG_LOAD`, as far as we set it.
#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

/// `union bpf_attr` for the element commands.
#[repr(C)]
struct MapElement {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `union bpf_attr` for `BPF_PROG_ATTACH`.
#[repr(C)]
struct ProgAttach {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
}

/// Calls `bpf(2)` with `attr`, returning its non-negative result.
fn bpf<T>(command: libc::c_int, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, initialised `#[repr(C)]` prefix of `union
    // bpf_attr` for `command`, and the size passed is its own: the kernel
    // reads (and for some commands writes) only that many bytes, and takes
    // the rest of the union as zero.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            std::ptr::from_mut(attr),
            std::mem::size_of::<T>(),
        )
    };
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

/// Takes ownership of a file descriptor `bpf(2)` returned.
fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: `fd` was just returned by the kernel as a new descriptor that
    // nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn name(text: &str) -> [u8; 16] {
    let mut name = [0; 16];
    for (slot, byte) in name.iter_mut().zip(text.bytes().take(15)) {
        *slot = byte;
    }
    name
}

/// A socket hash map keyed by socket cookie (`SO_COOKIE`).
pub struct SocketMap {
    fd: OwnedFd,
}

impl SocketMap {
    /// A map of up to `capacity` sockets, named `label` for `bpftool`.
    pub fn new(label: &str, capacity: u32) -> io::Result<SocketMap> {
        let mut attr = MapCreate {
            map_type: MAP_TYPE_SOCKHASH,
            key_size: 8,
            value_size: 8,
            max_entries: capacity,
            map_flags: 0,
            inner_map_fd: 0,
            numa_node: 0,
            map_name: name(label),
        };
        let fd = owned(bpf(BPF_MAP_CREATE, &mut attr)?)?;
        Ok(SocketMap { fd })
    }

    /// Puts `socket` in the map under `key`.
    pub fn insert(&self, key: u64, socket: &impl AsRawFd) -> io::Result<()> {
        let value = u64::try_from(socket.as_raw_fd())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut attr = MapElement {
            map_fd: self.raw(),
            _pad: 0,
            key: std::ptr::from_ref(&key) as u64,
            value: std::ptr::from_ref(&value) as u64,
            flags: UPDATE_ANY,
        };
        bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
    }

    /// Takes the socket under `key` out of the map; a missing one is not
    /// an error (closing a socket takes it out by itself).
    pub fn remove(&self, key: u64) {
        let mut attr = MapElement {
            map_fd: self.raw(),
            _pad: 0,
            key: std::ptr::from_ref(&key) as u64,
            value: 0,
            flags: 0,
        };
        // ENOENT is the only failure for a key of the right size.
        let _ = bpf(BPF_MAP_DELETE_ELEM, &mut attr);
    }

    fn raw(&self) -> u32 {
        // Descriptors are never negative.
        self.fd.as_raw_fd().unsigned_abs()
    }
}

/// The verdict program, loaded and attached to the map whose sockets it
/// runs for. Dropping it closes its descriptor; the attachment keeps it
/// loaded as long as the map lives.
pub struct Verdict {
    _fd: OwnedFd,
}

impl Verdict {
    /// Loads the program redirecting to the sockets of `peers` and attaches
    /// it to `active`, so that it runs for every socket put in `active`.
    pub fn attach(peers: &SocketMap, active: &SocketMap) -> io::Result<Verdict> {
        let program = verdict_program(peers.fd.as_raw_fd());
        let license = c"Apache-2.0";
        let mut attr = ProgLoad {
            prog_type: PROG_TYPE_SK_SKB,
            insn_cnt: program.len() as u32,
            insns: program.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: 0,
            log_size: 0,
            log_buf: 0,
            kern_version: 0,
            prog_flags: 0,
            prog_name: name("ztunnel_splice"),
        };
        let fd = owned(bpf(BPF_PROG_LOAD, &mut attr)?)?;
        let mut attach = ProgAttach {
            target_fd: active.raw(),
            attach_bpf_fd: fd.as_raw_fd().unsigned_abs(),
            attach_type: ATTACH_SK_SKB_VERDICT,
            attach_flags: 0,
        };
        bpf(BPF_PROG_ATTACH, &mut attach)?;
        Ok(Verdict { _fd: fd })
    }
}
