//! The socket monitor's vocabulary: libzmq's monitor events and protocol error codes (zmq.h,
//! 4.3), which the `zmq` crate does not export as numbers, and the reading of one event. The
//! publisher's connection watch and the subscriber's handshake watch both read them.

pub(crate) const EVENT_CONNECTED: u32 = 0x0001;
pub(crate) const EVENT_CONNECT_RETRIED: u32 = 0x0004;
pub(crate) const EVENT_LISTENING: u32 = 0x0008;
pub(crate) const EVENT_ACCEPTED: u32 = 0x0020;
pub(crate) const EVENT_ACCEPT_FAILED: u32 = 0x0040;
pub(crate) const EVENT_DISCONNECTED: u32 = 0x0200;
pub(crate) const EVENT_MONITOR_STOPPED: u32 = 0x0400;
pub(crate) const EVENT_HANDSHAKE_FAILED_NO_DETAIL: u32 = 0x0800;
pub(crate) const EVENT_HANDSHAKE_SUCCEEDED: u32 = 0x1000;
pub(crate) const EVENT_HANDSHAKE_FAILED_PROTOCOL: u32 = 0x2000;
pub(crate) const EVENT_HANDSHAKE_FAILED_AUTH: u32 = 0x4000;
pub(crate) const PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC: u32 = 0x1100_0001;
pub(crate) const PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH: u32 = 0x1100_0002;

/// A monitor event as libzmq sends it: frame 1 holds a 16-bit event and a 32-bit value
/// (frame 2, the endpoint, is not needed here).
pub(crate) fn monitor_event(frames: &[Vec<u8>]) -> Option<(u32, u32)> {
    let head = frames.first().filter(|f| f.len() >= 6)?;
    let event = u32::from(u16::from_ne_bytes([head[0], head[1]]));
    Some((
        event,
        u32::from_ne_bytes([head[2], head[3], head[4], head[5]]),
    ))
}
