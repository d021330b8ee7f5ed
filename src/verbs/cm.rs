//! Connecting RC queue pairs with rdma_cm (`-R`), as perftest's `-R` does, for fabrics
//! and users that rely on the connection manager's address and route resolution.
//!
//! The QPs stay ours (created on our device context, as without `-R`); rdma_cm only
//! carries the connection handshake. Because the QPs are not rdma_cm's, the library
//! leaves their state to us: after the handshake step that makes them valid we ask it
//! for the attributes (`rdma_init_qp_attr`) and apply them ourselves (INIT by us, RTR and
//! RTS from the CM, then `rdma_establish` on the active side).
//!
//! The server listens on the address of its chosen GID, on an ephemeral rdma_cm port it
//! announces in its endpoint over the control channel; lane i's connection request is
//! matched to lane i by the QP number the client announced for it. Every wait is bounded
//! by the session timeout and watches the control channel, so a peer's abort ends it.

use std::ffi::CStr;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;
use std::ptr::{NonNull, null_mut};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_mummy_sys::{
    ibv_get_device_name, ibv_qp_attr, ibv_qp_state, rdma_accept, rdma_ack_cm_event, rdma_bind_addr, rdma_cm_event,
    rdma_cm_event_type as ev, rdma_cm_id, rdma_conn_param, rdma_connect, rdma_create_event_channel, rdma_create_id,
    rdma_destroy_event_channel, rdma_destroy_id, rdma_disconnect, rdma_establish, rdma_event_channel, rdma_event_str,
    rdma_get_cm_event, rdma_init_qp_attr, rdma_listen, rdma_port_space, rdma_reject, rdma_resolve_addr,
    rdma_resolve_route, rdma_set_option,
};

use super::context::Rdma;
use super::qp::Qp;
use crate::error::{Error, Result};
use crate::signals;

/// How a connection step waits: at most `timeout` for each event, calling `watch` (with
/// what is awaited) every tick, so the caller can look at its peer over its own channel and
/// fail the wait when the peer is gone. The binding knows nothing of that channel.
pub struct CmWait<'a> {
    pub timeout: Duration,
    pub watch: &'a mut dyn FnMut(&str) -> Result<()>,
}

/// How often a wait wakes up to look at signals, the deadline and the control channel.
const TICK: Duration = Duration::from_millis(50);

/// The socket address rdma_cm should use for this side: the IP address of the chosen
/// GID (IPv4 for an IPv4-mapped GID), port 0.
pub fn local_address(rdma: &Rdma) -> Result<SocketAddr> {
    if !rdma.gid.use_grh || rdma.port.link_layer.label() != "Ethernet" {
        return Err(Error::Usage(format!(
            "-R needs an IP address on {} port {}: on InfiniBand that is IPoIB, which rdmabench does not look up; \
             drop -R (the default exchange connects the QPs by LID)",
            rdma.name(),
            rdma.port.port
        )));
    }
    let gid = rdma.gid.gid;
    if let Some(v4) = gid.to_ipv4_mapped() {
        return Ok(SocketAddr::V4(SocketAddrV4::new(v4, 0)));
    }
    Ok(SocketAddr::V6(SocketAddrV6::new(gid, 0, 0, scope_of(rdma, gid))))
}

/// Link-local IPv6 needs the interface index of the GID's netdev as its scope.
fn scope_of(rdma: &Rdma, ip: std::net::Ipv6Addr) -> u32 {
    if !ip.is_unicast_link_local() {
        return 0;
    }
    rdma.port
        .gids
        .iter()
        .find(|g| g.index == rdma.gid.index)
        .and_then(|g| g.netdev.as_deref())
        .and_then(|n| std::ffi::CString::new(n).ok())
        // SAFETY: a valid NUL-terminated name.
        .map_or(0, |n| unsafe { libc::if_nametoindex(n.as_ptr()) })
}

/// Where a client should connect: the server's announced address, with a link-local
/// IPv6 scope replaced by the client's own interface.
pub fn target(announced: &str, rdma: &Rdma) -> Result<SocketAddr> {
    let addr: SocketAddr = announced
        .parse()
        .map_err(|_| Error::Peer(format!("the server announced an invalid rdma_cm address {announced:?}")))?;
    Ok(match addr {
        SocketAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(*v6.ip(), v6.port(), 0, scope_of(rdma, *v6.ip()))),
        v4 => v4,
    })
}

struct EventChannel {
    raw: NonNull<rdma_event_channel>,
}

// SAFETY: the channel is a librdmacm handle that librdmacm lets any thread use; it is
// destroyed once, in Drop, after every id on it (they hold an Arc to it). Its events are
// read only by the thread that is connecting.
unsafe impl Send for EventChannel {}
// SAFETY: as for Send: shared references only read events, from the connecting thread.
unsafe impl Sync for EventChannel {}

impl EventChannel {
    fn new() -> Result<Arc<EventChannel>> {
        // SAFETY: plain constructor; NULL is checked.
        let raw = NonNull::new(unsafe { rdma_create_event_channel() }).ok_or_else(|| {
            Error::Environment(format!(
                "cannot open rdma_cm ({}); is the rdma_ucm module loaded (/dev/infiniband/rdma_cm)?",
                std::io::Error::last_os_error()
            ))
        })?;
        let chan = EventChannel { raw };
        // Non-blocking, so waits can poll with a deadline.
        let fd = chan.fd();
        // SAFETY: fcntl on a descriptor we own.
        unsafe { libc::fcntl(fd, libc::F_SETFL, libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK) };
        Ok(Arc::new(chan))
    }

    fn fd(&self) -> RawFd {
        // SAFETY: the channel is alive.
        unsafe { self.raw.as_ref().fd }
    }

    fn create_id(self: &Arc<Self>) -> Result<CmId> {
        let mut raw = null_mut();
        // SAFETY: the channel is alive; raw receives the new id.
        let rc = unsafe { rdma_create_id(self.raw.as_ptr(), &mut raw, null_mut(), rdma_port_space::RDMA_PS_TCP) };
        if rc != 0 {
            return Err(Error::Environment(format!(
                "cannot create an rdma_cm id: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(CmId { raw: NonNull::new(raw).expect("rdma_create_id succeeded"), connected: false, _chan: self.clone() })
    }

    /// The next event, acknowledged (its fields copied first). Fails when the wait passes
    /// `wait.timeout`, a signal arrives, or `wait.watch` fails (the caller's look at its peer).
    fn next(&self, wait: &mut CmWait, waiting_for: &str) -> Result<Event> {
        let timeout = wait.timeout;
        let deadline = Instant::now() + timeout;
        loop {
            signals::check()?;
            (wait.watch)(waiting_for)?;
            let mut raw: *mut rdma_cm_event = null_mut();
            // SAFETY: non-blocking read of one event from a live channel.
            if unsafe { rdma_get_cm_event(self.raw.as_ptr(), &mut raw) } == 0 {
                // SAFETY: a returned event is valid until acknowledged.
                let e = unsafe { &*raw };
                let event = Event {
                    kind: e.event,
                    status: e.status,
                    id: e.id,
                    // SAFETY: `conn` is the member in use for connection events; other events leave it zeroed.
                    remote_qpn: unsafe { e.param.conn.qp_num },
                };
                // SAFETY: acknowledged once; nothing refers to it afterwards.
                unsafe { rdma_ack_cm_event(raw) };
                return Ok(event);
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::WouldBlock {
                return Err(Error::Environment(format!("reading rdma_cm events: {err}")));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Peer(format!(
                    "no rdma_cm {waiting_for} within {:.1} s (--timeout); the peer hung, or the CM cannot reach it",
                    timeout.as_secs_f64()
                )));
            }
            let mut pfd = libc::pollfd { fd: self.fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, left.min(TICK).as_millis() as i32) };
        }
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id holds the channel (Arc), so none is left when this runs.
        unsafe { rdma_destroy_event_channel(self.raw.as_ptr()) };
    }
}

struct Event {
    kind: u32,
    status: i32,
    id: *mut rdma_cm_id,
    remote_qpn: u32,
}

impl Event {
    fn name(&self) -> String {
        // SAFETY: rdma_event_str returns a static string for any value.
        unsafe { CStr::from_ptr(rdma_event_str(self.kind)) }.to_string_lossy().into_owned()
    }

    /// Why an unexpected event ended the handshake.
    fn failure(&self, step: &str) -> Error {
        let status = if self.status < 0 {
            format!(" ({})", std::io::Error::from_raw_os_error(-self.status))
        } else if self.status > 0 {
            format!(" (status {})", self.status)
        } else {
            String::new()
        };
        let hint = match self.kind {
            ev::RDMA_CM_EVENT_REJECTED => "; the server refused the connection",
            ev::RDMA_CM_EVENT_ADDR_ERROR | ev::RDMA_CM_EVENT_ROUTE_ERROR | ev::RDMA_CM_EVENT_UNREACHABLE => {
                "; check that the address is on an RDMA netdev and reachable (ip route, rdma link)"
            }
            _ => "",
        };
        Error::Environment(format!("rdma_cm {step} failed: got {}{status}{hint}", self.name()))
    }
}

struct CmId {
    raw: NonNull<rdma_cm_id>,
    connected: bool,
    // Events of this id arrive on the channel; it must outlive the id.
    _chan: Arc<EventChannel>,
}

// SAFETY: the id is a librdmacm handle owned by this value (destroyed once, in Drop,
// before the channel it holds an Arc to); librdmacm allows an id to be used from any
// thread, and a connection's id is used only by the thread that owns the link.
unsafe impl Send for CmId {}
// SAFETY: once connected, nothing uses the id but Drop (with exclusive access); a link
// shared by its threads holds it only to disconnect it at the end. While connecting, the
// one connecting thread owns it.
unsafe impl Sync for CmId {}

impl CmId {
    fn ptr(&self) -> *mut rdma_cm_id {
        self.raw.as_ptr()
    }

    /// Fails unless rdma_cm bound this id to the device and port the test opened.
    fn check_device(&self, rdma: &Rdma, addr: &SocketAddr) -> Result<()> {
        // SAFETY: the id is alive; `verbs` is set once it is bound to a device.
        let (verbs, port) = unsafe { ((*self.ptr()).verbs, (*self.ptr()).port_num) };
        if verbs.is_null() {
            return Err(Error::Environment(format!("rdma_cm bound {addr} to no RDMA device")));
        }
        // SAFETY: a bound id's context and device are valid; the name is NUL-terminated.
        let name = unsafe { CStr::from_ptr(ibv_get_device_name((*verbs).device)) }.to_string_lossy().into_owned();
        if name != rdma.name() || port != rdma.port.port {
            return Err(Error::Usage(format!(
                "rdma_cm routes {addr} over {name} port {port}, but this test uses {} port {}; choose that \
                 device with -d/-i or a GID (-x) whose address is on it",
                rdma.name(),
                rdma.port.port
            )));
        }
        Ok(())
    }

    fn qp_attr(&self, state: ibv_qp_state::Type) -> Result<(ibv_qp_attr, i32)> {
        // SAFETY: all-zero is a valid ibv_qp_attr; the id is alive.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = state;
        let mut mask = 0;
        // SAFETY: as above; attr and mask are valid out-parameters.
        if unsafe { rdma_init_qp_attr(self.ptr(), &mut attr, &mut mask) } != 0 {
            return Err(Error::Environment(format!(
                "rdma_cm gave no QP attributes: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok((attr, mask))
    }

    /// Moves our QP to RTR and RTS with the attributes rdma_cm negotiated.
    fn ready_qp(&self, qp: &Qp, rd_atomic: u8, mtu: Option<u32>) -> Result<()> {
        let (rtr, mask) = self.qp_attr(ibv_qp_state::IBV_QPS_RTR)?;
        qp.apply_cm(rtr, mask, "RTR", rd_atomic, mtu)?;
        let (rts, mask) = self.qp_attr(ibv_qp_state::IBV_QPS_RTS)?;
        qp.apply_cm(rts, mask, "RTS", rd_atomic, mtu)
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the id is alive and ours; events already read were acknowledged, so
        // destroying it cannot wait on us.
        unsafe {
            if self.connected {
                rdma_disconnect(self.ptr());
            }
            rdma_destroy_id(self.ptr());
        }
    }
}

fn conn_param(qp: &Qp, rd_atomic: u8) -> rdma_conn_param {
    rdma_conn_param {
        private_data: std::ptr::null(),
        private_data_len: 0,
        responder_resources: rd_atomic,
        initiator_depth: rd_atomic,
        flow_control: 0,
        retry_count: qp.path().retry_count,
        rnr_retry_count: qp.path().rnr_retry,
        srq: 0,
        qp_num: qp.qpn(),
    }
}

/// rdma_cma.h's RDMA_OPTION_ID level and its RDMA_OPTION_ID_TOS option (a u8, RFC 2474),
/// not in the generated bindings (an anonymous enum).
const RDMA_OPTION_ID: i32 = 0;
const RDMA_OPTION_ID_TOS: i32 = 0;

/// Gives the id's traffic (its connection messages, and the route's traffic class) type of
/// service `tos`.
fn set_tos(id: &CmId, tos: u8) -> Result<()> {
    let mut v = tos;
    // SAFETY: the id is alive; the option takes one byte, which `v` is.
    let rc = unsafe { rdma_set_option(id.ptr(), RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, (&mut v as *mut u8).cast(), 1) };
    if rc != 0 {
        return Err(os_fail(&format!("rdma_cm cannot set type of service {tos}")));
    }
    Ok(())
}

fn os_fail(what: &str) -> Error {
    Error::Environment(format!("{what}: {}", std::io::Error::last_os_error()))
}

fn to_os(addr: &SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage; the writes below stay inside it.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as u16,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as u16,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_in6 fits in sockaddr_storage.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
        }
    }
    ss
}

/// One QP's rdma_cm connection. Kept as long as the QP is used; dropping it disconnects.
pub struct CmConnection {
    _id: CmId,
}

/// The server's listening rdma_cm id, for as many connections as the test has QPs.
pub struct CmListener {
    chan: Arc<EventChannel>,
    id: CmId,
    /// The bound address with its port, announced to the client.
    pub address: SocketAddr,
}

impl CmListener {
    /// Listens on `rdma`'s address; accepted connections get type of service `tos`.
    pub fn listen(rdma: &Rdma, tos: u8) -> Result<CmListener> {
        let chan = EventChannel::new()?;
        let id = chan.create_id()?;
        set_tos(&id, tos)?;
        let mut address = local_address(rdma)?;
        let mut os = to_os(&address);
        // SAFETY: the id is alive; `os` is a valid address of its family.
        if unsafe { rdma_bind_addr(id.ptr(), (&mut os as *mut libc::sockaddr_storage).cast()) } != 0 {
            return Err(os_fail(&format!("cannot bind rdma_cm to {address}")));
        }
        id.check_device(rdma, &address)?;
        // SAFETY: a bound id.
        if unsafe { rdma_listen(id.ptr(), 16) } != 0 {
            return Err(os_fail(&format!("cannot listen with rdma_cm on {address}")));
        }
        // SAFETY: a bound id's source address is set; sin_port and sin6_port share their
        // offset and are in network order.
        address.set_port(u16::from_be(unsafe { (*id.ptr()).route.addr.src_addr_union.src_sin.sin_port }));
        Ok(CmListener { chan, id, address })
    }

    /// Waits for the connection request of the client's QP `remote_qpn` and accepts it
    /// on `qp`. Requests for other QP numbers (strays) are rejected.
    pub fn accept(
        &self,
        rdma: &Rdma,
        qp: &Qp,
        remote_qpn: u32,
        rd_atomic: u8,
        mtu: Option<u32>,
        wait: &mut CmWait,
    ) -> Result<CmConnection> {
        let mut id = loop {
            let e = self.chan.next(wait, "connection request")?;
            if e.kind != ev::RDMA_CM_EVENT_CONNECT_REQUEST || e.id == self.id.ptr() {
                continue;
            }
            let id = CmId {
                raw: NonNull::new(e.id).expect("a request has an id"),
                connected: false,
                _chan: self.chan.clone(),
            };
            if e.remote_qpn == remote_qpn {
                break id;
            }
            // SAFETY: a request id not yet accepted may be rejected.
            unsafe { rdma_reject(id.ptr(), std::ptr::null(), 0) };
        };
        id.check_device(rdma, &self.address)?;
        qp.init(rdma)?;
        // RTS before the reply, as librdmacm does for its own QPs: the client may send
        // as soon as it has the reply.
        id.ready_qp(qp, rd_atomic, mtu)?;
        let mut param = conn_param(qp, rd_atomic);
        // SAFETY: the id holds an unanswered request; param is valid for the call.
        if unsafe { rdma_accept(id.ptr(), &mut param) } != 0 {
            return Err(os_fail("rdma_cm accept failed"));
        }
        id.connected = true;
        let e = self.chan.next(wait, "connection establishment")?;
        if e.kind != ev::RDMA_CM_EVENT_ESTABLISHED {
            return Err(e.failure("accept"));
        }
        Ok(CmConnection { _id: id })
    }
}

/// Connects `qp` to the server listening at `dst` (client side).
pub fn connect(
    rdma: &Rdma,
    qp: &Qp,
    dst: SocketAddr,
    rd_atomic: u8,
    mtu: Option<u32>,
    wait: &mut CmWait,
) -> Result<CmConnection> {
    let timeout = wait.timeout;
    let chan = EventChannel::new()?;
    let mut id = chan.create_id()?;
    set_tos(&id, qp.path().traffic_class)?;
    let src = local_address(rdma)?;
    let (mut os_src, mut os_dst) = (to_os(&src), to_os(&dst));
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    let expect = |id: &CmId, wait: &mut CmWait, kind: u32, step: &str| -> Result<()> {
        let e = chan.next(wait, step)?;
        if e.kind != kind || e.id != id.ptr() {
            return Err(e.failure(step));
        }
        Ok(())
    };
    // SAFETY: the id is alive; both addresses are valid for their family.
    if unsafe {
        rdma_resolve_addr(
            id.ptr(),
            (&mut os_src as *mut libc::sockaddr_storage).cast(),
            (&mut os_dst as *mut libc::sockaddr_storage).cast(),
            ms,
        )
    } != 0
    {
        return Err(os_fail(&format!("rdma_cm cannot resolve {dst} from {src}")));
    }
    expect(&id, wait, ev::RDMA_CM_EVENT_ADDR_RESOLVED, "address resolution")?;
    id.check_device(rdma, &src)?;
    // SAFETY: the address is resolved.
    if unsafe { rdma_resolve_route(id.ptr(), ms) } != 0 {
        return Err(os_fail(&format!("rdma_cm cannot resolve a route to {dst}")));
    }
    expect(&id, wait, ev::RDMA_CM_EVENT_ROUTE_RESOLVED, "route resolution")?;
    qp.init(rdma)?;
    let mut param = conn_param(qp, rd_atomic);
    // SAFETY: the route is resolved; param is valid for the call.
    if unsafe { rdma_connect(id.ptr(), &mut param) } != 0 {
        return Err(os_fail(&format!("rdma_cm cannot connect to {dst}")));
    }
    id.connected = true;
    // With a QP of our own, librdmacm reports the reply instead of finishing the
    // handshake: we move the QP and then send the ready-to-use message.
    expect(&id, wait, ev::RDMA_CM_EVENT_CONNECT_RESPONSE, "connection")?;
    id.ready_qp(qp, rd_atomic, mtu)?;
    // SAFETY: a connection in the reply-received state.
    if unsafe { rdma_establish(id.ptr()) } != 0 {
        return Err(os_fail("rdma_cm establish failed"));
    }
    Ok(CmConnection { _id: id })
}
