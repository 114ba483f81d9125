//! A synchronous rtnetlink dump (`RTM_GETLINK`, `RTM_GETQDISC`) with a deadline.
//!
//! The sampler runs on a blocking thread; the socket is non-blocking and every receive is
//! bounded by [`DUMP_TIMEOUT`], so a kernel that never answers cannot hang a sweep. The
//! socket belongs to the network namespace of the thread that opened it.

use std::{
    io,
    time::{Duration, Instant},
};

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// Longest a whole dump may take. A dump of a few thousand links takes milliseconds.
pub const DUMP_TIMEOUT: Duration = Duration::from_secs(2);
/// The kernel caps one dump skb at 32 KiB (`netlink_recvmsg`); twice that never truncates.
const RECV_BUF: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum RtnlError {
    #[error("cannot open a NETLINK_ROUTE socket: {0}")]
    Open(#[source] io::Error),
    #[error("netlink send/receive failed: {0}")]
    Io(#[source] io::Error),
    #[error("the kernel refused the dump request: {0}")]
    Kernel(#[source] io::Error),
    #[error("no complete dump answer within {0:?}")]
    Timeout(Duration),
}

/// The messages of one dump, and how many could not be decoded (counted by the caller).
#[derive(Debug, Default)]
pub struct Dump {
    pub messages: Vec<RouteNetlinkMessage>,
    pub undecodable: usize,
    /// The kernel flagged the dump as interrupted by a concurrent change (`NLM_F_DUMP_INTR`):
    /// the set may be incomplete, values are still valid.
    pub interrupted: bool,
}

pub struct Rtnl {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl Rtnl {
    pub fn open() -> Result<Self, RtnlError> {
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(RtnlError::Open)?;
        sock.bind_auto().map_err(RtnlError::Open)?;
        sock.connect(&SocketAddr::new(0, 0)).map_err(RtnlError::Open)?;
        sock.set_non_blocking(true).map_err(RtnlError::Open)?;
        Ok(Rtnl { sock, seq: 0, buf: vec![0; RECV_BUF] })
    }

    /// Sends `request` as a dump and collects every answer until `NLMSG_DONE`.
    pub fn dump(&mut self, request: RouteNetlinkMessage) -> Result<Dump, RtnlError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_DUMP | NLM_F_REQUEST;
        header.sequence_number = seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(request));
        packet.finalize();
        let mut out = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut out);
        self.sock.send(&out, 0).map_err(RtnlError::Io)?;

        let deadline = Instant::now() + DUMP_TIMEOUT;
        let mut dump = Dump::default();
        loop {
            let n = match self.sock.recv(&mut &mut self.buf[..], 0) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // The kernel fills the next chunk while we read the previous one, so
                    // an empty queue mid-dump is rare and brief.
                    if Instant::now() >= deadline {
                        return Err(RtnlError::Timeout(DUMP_TIMEOUT));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(RtnlError::Io(e)),
            };
            let mut offset = 0;
            while offset < n {
                let bytes = &self.buf[offset..n];
                // nlmsg_len is the first u32 of each message; a zero or short length is garbage.
                let len = bytes.get(..4).and_then(|b| b.try_into().ok()).map(u32::from_ne_bytes).unwrap_or(0) as usize;
                if len < 16 || len > bytes.len() {
                    dump.undecodable += 1;
                    break;
                }
                let msg_seq = bytes.get(8..12).and_then(|b| b.try_into().ok()).map(u32::from_ne_bytes).unwrap_or(0);
                let flags = bytes.get(6..8).and_then(|b| b.try_into().ok()).map(u16::from_ne_bytes).unwrap_or(0);
                // nlmsg lengths are 4-aligned in the stream.
                offset += (len + 3) & !3;
                if msg_seq != seq {
                    // A late answer to an earlier dump that timed out: not ours.
                    continue;
                }
                if flags & NLM_F_DUMP_INTR != 0 {
                    dump.interrupted = true;
                }
                match NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes[..len]) {
                    Ok(m) => match m.payload {
                        NetlinkPayload::Done(_) => return Ok(dump),
                        NetlinkPayload::Error(e) => match e.code {
                            Some(_) => return Err(RtnlError::Kernel(e.to_io())),
                            None => return Ok(dump),
                        },
                        NetlinkPayload::InnerMessage(inner) => dump.messages.push(inner),
                        _ => {}
                    },
                    Err(_) => dump.undecodable += 1,
                }
            }
            if Instant::now() >= deadline {
                return Err(RtnlError::Timeout(DUMP_TIMEOUT));
            }
        }
    }
}
