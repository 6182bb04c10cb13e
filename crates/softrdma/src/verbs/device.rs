//! A device: one IP address, one UDP port 4791, one memory table, one engine.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::{Cq, Pd, VerbsError};
use crate::mem::{MemConfig, MemoryTable, PinMode, RawCopy, RemapPolicy, WatchMode};
use crate::net::engine::{self, Engine, PollMode};
use crate::net::{ChannelCore, PortOptions, UdpPort};
use crate::rc::Mtu;
use crate::wire::ROCE_PORT;

/// How to open a device.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// The address the device is: it binds `<addr>:port`; its GID is this address
    /// (IPv4-mapped for IPv4).
    pub addr: IpAddr,
    /// UDP port (4791 for RoCEv2; tests may use another).
    pub port: u16,
    /// Blocking (low CPU) or busy-poll (low latency).
    pub mode: PollMode,
    /// Pin registered memory (`mlock`, accounted) or not (on-demand).
    pub pin_mode: PinMode,
    /// The port's active MTU (the largest path MTU a QP may use).
    pub active_mtu: Mtu,
    /// Socket buffer size.
    pub socket_buffer: usize,
    /// Coalesce consecutive packets to one peer into UDP GSO datagrams (the kernel segments
    /// them; segment k carries IPv4 identification k, which the ICRC accounts for).
    pub gso: bool,
    /// Whether raw regions are watched for `munmap`, `mremap` and `madvise` (userfaultfd;
    /// docs/COHERENCE.md says what it needs and what happens without it).
    pub watch: WatchMode,
    /// What `mremap` does to raw regions that did not choose (`MemSource::remap_policy`).
    pub remap_policy: RemapPolicy,
    /// How raw regions are copied: kernel-checked (an unmapped page fails the access) or plain.
    pub raw_copy: RawCopy,
    /// Send window of each QP: most unacknowledged packets in flight. Linux rxe keeps 128;
    /// softrdma defaults to 1024 (4 MiB at path MTU 4096) so a fast path stays full between
    /// acknowledgements.
    pub send_window: u32,
}

impl DeviceConfig {
    /// Defaults for `addr`: port 4791, blocking engine, pinned memory, active MTU 4096 (loopback
    /// and jumbo links; use 1024 on an Ethernet MTU of 1500).
    pub fn new(addr: IpAddr) -> DeviceConfig {
        DeviceConfig {
            addr,
            port: ROCE_PORT,
            mode: PollMode::Blocking,
            pin_mode: PinMode::Pinned,
            active_mtu: Mtu::Mtu4096,
            socket_buffer: 8 << 20,
            gso: true,
            watch: WatchMode::On,
            remap_policy: RemapPolicy::Invalidate,
            raw_copy: RawCopy::Checked,
            send_window: 1024,
        }
    }
}

/// Device attributes (`ibv_device_attr`, the fields that mean something here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Largest region.
    pub max_mr_size: u64,
    /// Most QPs.
    pub max_qp: u32,
    /// Most WRs per queue.
    pub max_qp_wr: u32,
    /// Most SGEs per WR.
    pub max_sge: u32,
    /// Most CQs.
    pub max_cq: u32,
    /// Most entries per CQ.
    pub max_cqe: u32,
    /// Most regions.
    pub max_mr: u32,
    /// Most PDs.
    pub max_pd: u32,
    /// Outstanding READ/atomic requests per QP as responder.
    pub max_qp_rd_atom: u32,
    /// Outstanding READ/atomic requests per QP as requester.
    pub max_qp_init_rd_atom: u32,
    /// Most windows.
    pub max_mw: u32,
    /// Most SRQs.
    pub max_srq: u32,
    /// Most WRs per SRQ.
    pub max_srq_wr: u32,
    /// Atomics are atomic with respect to the whole device (`IBV_ATOMIC_HCA`).
    pub atomic_hca: bool,
}

/// Port attributes (`ibv_port_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortAttr {
    /// Largest MTU.
    pub max_mtu: Mtu,
    /// Active MTU.
    pub active_mtu: Mtu,
    /// GID table length.
    pub gid_tbl_len: u32,
}

pub(crate) struct DeviceInner {
    pub engine: Arc<Engine>,
    pub cfg: DeviceConfig,
    thread: Option<JoinHandle<()>>,
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        self.engine.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for DeviceInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("addr", &self.cfg.addr)
            .finish()
    }
}

/// An open device. Cheap to clone; the engine stops when the last handle (and every object
/// made from it) is gone.
#[derive(Clone, Debug)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

/// Maximum work requests per queue.
pub const MAX_QP_WR: u32 = 1 << 15;
/// Maximum entries per CQ.
pub const MAX_CQE: u32 = 1 << 20;

impl Device {
    /// Open a device on `cfg.addr`: bind the UDP port and start the engine thread.
    pub fn open(cfg: DeviceConfig) -> Result<Device, VerbsError> {
        let port = UdpPort::bind(
            SocketAddr::new(cfg.addr, cfg.port),
            PortOptions {
                buffer_bytes: cfg.socket_buffer,
                gro: true,
                nonblocking: true,
            },
        )?;
        let mem = Arc::new(MemoryTable::new(MemConfig {
            pin_mode: cfg.pin_mode,
            watch: cfg.watch,
            remap_policy: cfg.remap_policy,
            raw_copy: cfg.raw_copy,
            ..MemConfig::default()
        })?);
        let engine = Arc::new(Engine::new(port, mem, cfg.mode, cfg.gso)?);
        engine.watch_invalidations();
        let thread = Some(engine::spawn(engine.clone())?);
        Ok(Device {
            inner: Arc::new(DeviceInner {
                engine,
                cfg,
                thread,
            }),
        })
    }

    /// Open a device on a memory network's port at `<cfg.addr>:cfg.port`, on `clock`, with
    /// no engine thread: the owner drives it ([`Device::drive`]) and moves the network's
    /// datagrams. The datapath is the one a socket device runs, so a simulation of such
    /// devices (with `cfg.mode` busy-poll: acknowledgements held, posts left for polls)
    /// exercises lending, GSO datagrams, demultiplexing and the peer check as they run.
    pub fn open_on(
        cfg: DeviceConfig,
        net: &Arc<crate::net::MemoryNet>,
        clock: crate::net::Clock,
    ) -> Result<Device, VerbsError> {
        let port = crate::net::Port::Memory(net.port(SocketAddr::new(cfg.addr, cfg.port)));
        let mem = Arc::new(MemoryTable::new(MemConfig {
            pin_mode: cfg.pin_mode,
            watch: cfg.watch,
            remap_policy: cfg.remap_policy,
            raw_copy: cfg.raw_copy,
            ..MemConfig::default()
        })?);
        let engine = Arc::new(Engine::with_port(port, mem, (cfg.mode, cfg.gso), clock)?);
        engine.watch_invalidations();
        Ok(Device {
            inner: Arc::new(DeviceInner {
                engine,
                cfg,
                thread: None,
            }),
        })
    }

    /// Drive a device opened with [`Device::open_on`] once, as its engine thread would:
    /// receive what waits, fire due timers, send what is pending. Returns the packets
    /// received and when the device next needs driving (a transport timer or a held
    /// acknowledgement; `None`: only when datagrams arrive or work is posted).
    pub fn drive(&self) -> (usize, Option<u64>) {
        self.inner.engine.drive_once()
    }

    /// The configuration the device was opened with.
    pub fn config(&self) -> &DeviceConfig {
        &self.inner.cfg
    }

    /// The device address.
    pub fn addr(&self) -> IpAddr {
        self.inner.cfg.addr
    }

    /// The bound UDP address.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.engine.local_addr()
    }

    /// The GID: the IPv4-mapped IPv6 address (or the IPv6 address).
    pub fn gid(&self) -> [u8; 16] {
        match self.inner.cfg.addr {
            IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            IpAddr::V6(a) => a.octets(),
        }
    }

    /// Device attributes.
    pub fn query_device(&self) -> DeviceAttr {
        let mem = self.inner.engine.mem().config();
        DeviceAttr {
            max_mr_size: 1 << 40,
            max_qp: 1 << 16,
            max_qp_wr: MAX_QP_WR,
            max_sge: crate::rc::MAX_SGE as u32,
            max_cq: 1 << 16,
            max_cqe: MAX_CQE,
            max_mr: mem.max_keys,
            max_pd: mem.max_pds,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
            max_mw: mem.max_keys,
            max_srq: 1 << 12,
            max_srq_wr: MAX_QP_WR,
            atomic_hca: true,
        }
    }

    /// Port attributes.
    pub fn query_port(&self) -> PortAttr {
        PortAttr {
            max_mtu: Mtu::Mtu4096,
            active_mtu: self.inner.cfg.active_mtu,
            gid_tbl_len: 2,
        }
    }

    /// Allocate a protection domain.
    pub fn alloc_pd(&self) -> Result<Pd, VerbsError> {
        let pd = self.inner.engine.mem().alloc_pd()?;
        Ok(Pd::new(self.clone(), pd))
    }

    /// Create a completion queue of `cqe` entries, reporting to `channel` if given.
    pub fn create_cq(
        &self,
        cqe: u32,
        channel: Option<&super::CompChannel>,
    ) -> Result<Cq, VerbsError> {
        if cqe == 0 || cqe > MAX_CQE {
            return Err(VerbsError::InvalidArgument(format!(
                "cqe {cqe} not in 1..={MAX_CQE}"
            )));
        }
        Ok(Cq::new(
            self.clone(),
            cqe as usize,
            channel.map(|c| c.core.clone()),
        ))
    }

    /// Create a completion channel.
    pub fn create_comp_channel(&self) -> Result<super::CompChannel, VerbsError> {
        let engine = &self.inner.engine;
        // In busy-poll mode nobody receives for a thread asleep on the channel but the engine
        // thread: the channel's descriptor watches the socket too, so that the thread wakes
        // for the packet itself (see `ChannelCore::watching`).
        // While an application thread busy-polls, the descriptor leaves the socket alone
        // (`Engine::add_watching_channel`).
        let core = match engine.mode() {
            PollMode::BusyPoll if engine.socket_fd() >= 0 => {
                let core = Arc::new(ChannelCore::watching(1024, engine.socket_fd())?);
                engine.add_watching_channel(&core);
                core
            }
            _ => Arc::new(ChannelCore::new(1024)?),
        };
        Ok(super::CompChannel {
            core,
            device: self.clone(),
        })
    }

    /// The next asynchronous event (`ibv_get_async_event`), waiting up to `timeout`; `None`
    /// when none came. Events go to the hook instead while one is set.
    pub fn get_async_event(&self, timeout: std::time::Duration) -> Option<crate::net::AsyncEvent> {
        self.inner.engine.events().wait(timeout)
    }

    /// Deliver asynchronous events to `hook` (run on the engine thread; it must not block)
    /// instead of queueing them for [`Device::get_async_event`]; `None` queues them again.
    pub fn set_async_event_hook(&self, hook: Option<crate::net::AsyncEventHook>) {
        self.inner.engine.events().set_hook(hook);
    }

    /// Datapath counters.
    pub fn counters(&self) -> &crate::net::EngineCounters {
        self.inner.engine.counters()
    }

    /// The memory table (regions, windows, keys) this device's engine checks every access
    /// against; for callers that manage regions beyond [`Pd::reg_mr`] (re-registration).
    pub fn mem(&self) -> &Arc<MemoryTable> {
        self.inner.engine.mem()
    }

    /// Memory counters.
    pub fn mem_stats(&self) -> crate::mem::MemStats {
        self.inner.engine.mem().stats()
    }

    /// Receive and process queued packets in this thread (what `Cq::poll` does in busy-poll
    /// mode). Returns the packets processed.
    pub fn progress(&self) -> usize {
        // Timers are the engine thread's; a poller only receives.
        self.inner.engine.progress(false)
    }

    pub(crate) fn engine(&self) -> &Arc<Engine> {
        &self.inner.engine
    }
}
