//! The reply codec: how the answers of a cast's receivers travel back.
//!
//! A reply message is sent to a *reply port* (a port of some agent's reply router) and
//! its parts are the reply key, then one or more *items*:
//!
//! ```text
//! key: u64 | item | item | ...
//! item = head | part * nparts
//! head = index: u32 | status: u8 | nparts: u32          (little-endian, 9 bytes)
//! ```
//!
//! `index` is the receiver's position in the view the cast was sent to, `status` one of
//! [`ReplyStatus`]. A value's parts are opaque here (a bincode value for Rust actors, a
//! pickle and its out-of-band buffers for Python ones) and are never copied: a tree
//! node that reduces replies moves whole items without decoding them.
//!
//! ```
//! use bytes::Bytes;
//! use hyperactor_mesh::cast::reply::{decode_reply, encode_reply, ReplyItem, ReplyStatus};
//!
//! let items = vec![
//!     ReplyItem::ok(3, vec![Bytes::from_static(b"value")]),
//!     ReplyItem::failed(4, "its proc died"),
//! ];
//! let parts = encode_reply(7, &items);
//! let (key, back) = decode_reply(&parts).unwrap();
//! assert_eq!((key, back), (7, items));
//! ```

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::CodecError;

/// How a receiver answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReplyStatus {
    /// The handler returned a value (the item's parts).
    Ok = 0,
    /// The handler raised an error that the caller receives (the actor lives on).
    Error = 1,
    /// The receiver cannot answer: the actor failed, its process died, or the message
    /// could not reach it. One part: the reason, in UTF-8.
    Failed = 2,
    /// The receiver cannot answer because it was stopped (or its proc was): not a
    /// failure. One part: the reason, in UTF-8.
    Stopped = 3,
}

impl ReplyStatus {
    fn from_u8(b: u8) -> Option<Self> {
        match b {
            0 => Some(Self::Ok),
            1 => Some(Self::Error),
            2 => Some(Self::Failed),
            3 => Some(Self::Stopped),
            _ => None,
        }
    }
}

/// One receiver's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyItem {
    /// The receiver's position in the view.
    pub index: u32,
    /// How it answered.
    pub status: ReplyStatus,
    /// The value's parts (or the reason, for [`ReplyStatus::Failed`]).
    pub parts: Vec<Bytes>,
}

impl ReplyItem {
    /// A value.
    pub fn ok(index: u32, parts: Vec<Bytes>) -> Self {
        Self {
            index,
            status: ReplyStatus::Ok,
            parts,
        }
    }

    /// An error the handler raised.
    pub fn error(index: u32, parts: Vec<Bytes>) -> Self {
        Self {
            index,
            status: ReplyStatus::Error,
            parts,
        }
    }

    /// The receiver cannot answer, because of `reason`.
    pub fn failed(index: u32, reason: &str) -> Self {
        Self {
            index,
            status: ReplyStatus::Failed,
            parts: vec![Bytes::copy_from_slice(reason.as_bytes())],
        }
    }

    /// The receiver cannot answer because it was stopped, for `reason`.
    pub fn stopped(index: u32, reason: &str) -> Self {
        Self {
            index,
            status: ReplyStatus::Stopped,
            parts: vec![Bytes::copy_from_slice(reason.as_bytes())],
        }
    }

    /// [`ReplyItem::stopped`] or [`ReplyItem::failed`].
    pub fn unanswered(index: u32, reason: &str, stopped: bool) -> Self {
        if stopped {
            Self::stopped(index, reason)
        } else {
            Self::failed(index, reason)
        }
    }

    /// Whether the receiver cannot answer (failed or stopped).
    pub fn is_unanswered(&self) -> bool {
        matches!(self.status, ReplyStatus::Failed | ReplyStatus::Stopped)
    }

    /// The reason of an item that is not an answer (empty for other items).
    pub fn reason(&self) -> String {
        match (self.is_unanswered(), self.parts.first()) {
            (true, Some(part)) => String::from_utf8_lossy(part).into_owned(),
            _ => String::new(),
        }
    }

    /// Appends the item's parts to `out`.
    pub fn encode_into(&self, out: &mut Vec<Bytes>) {
        out.push(head(self.index, self.status, self.parts.len()));
        out.extend(self.parts.iter().cloned());
    }
}

const HEAD_LEN: usize = 9;

/// The head part of an item.
pub fn head(index: u32, status: ReplyStatus, nparts: usize) -> Bytes {
    let mut buf = BytesMut::with_capacity(HEAD_LEN);
    buf.put_u32_le(index);
    buf.put_u8(status as u8);
    buf.put_u32_le(u32::try_from(nparts).unwrap_or(u32::MAX));
    buf.freeze()
}

/// The key part of a reply message.
pub fn key_part(key: u64) -> Bytes {
    Bytes::copy_from_slice(&key.to_le_bytes())
}

/// The parts of a reply message for `key` carrying `items`.
pub fn encode_reply(key: u64, items: &[ReplyItem]) -> Vec<Bytes> {
    let mut out = Vec::with_capacity(1 + items.iter().map(|i| 1 + i.parts.len()).sum::<usize>());
    out.push(key_part(key));
    for item in items {
        item.encode_into(&mut out);
    }
    out
}

/// The key of a reply message (its first part).
///
/// # Errors
///
/// [`CodecError::Reply`] if the first part is missing or not 8 bytes.
pub fn reply_key(parts: &[Bytes]) -> Result<u64, CodecError> {
    parts
        .first()
        .and_then(|p| <[u8; 8]>::try_from(&p[..]).ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| CodecError::Reply("the key part is missing or not 8 bytes".into()))
}

/// The items of a reply message's parts after the key, as `(index, status, range of
/// the item's parts in `parts`, head included)`.
///
/// # Errors
///
/// [`CodecError::Reply`] if a head is malformed or an item's parts are missing.
pub fn split_items(
    parts: &[Bytes],
) -> Result<Vec<(u32, ReplyStatus, std::ops::Range<usize>)>, CodecError> {
    let mut items = Vec::new();
    let mut at = 0;
    while at < parts.len() {
        let head = &parts[at][..];
        if head.len() != HEAD_LEN {
            return Err(CodecError::Reply(format!(
                "item head at part {at} has {} bytes, expected {HEAD_LEN}",
                head.len()
            )));
        }
        let index = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let status = ReplyStatus::from_u8(head[4])
            .ok_or_else(|| CodecError::Reply(format!("unknown reply status {}", head[4])))?;
        let nparts = u32::from_le_bytes([head[5], head[6], head[7], head[8]]) as usize;
        let end = at
            .checked_add(1)
            .and_then(|a| a.checked_add(nparts))
            .filter(|&end| end <= parts.len())
            .ok_or_else(|| {
                CodecError::Reply(format!(
                    "item {index} claims {nparts} parts; only {} follow",
                    parts.len() - at - 1
                ))
            })?;
        items.push((index, status, at..end));
        at = end;
    }
    Ok(items)
}

/// Decodes a whole reply message: its key and items.
///
/// # Errors
///
/// As [`reply_key`] and [`split_items`].
pub fn decode_reply(parts: &[Bytes]) -> Result<(u64, Vec<ReplyItem>), CodecError> {
    let key = reply_key(parts)?;
    let rest = &parts[1..];
    let items = split_items(rest)?
        .into_iter()
        .map(|(index, status, range)| ReplyItem {
            index,
            status,
            parts: rest[range.start + 1..range.end].to_vec(),
        })
        .collect();
    Ok((key, items))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_replies_are_errors() {
        assert!(reply_key(&[]).is_err());
        assert!(reply_key(&[Bytes::from_static(b"short")]).is_err());
        let mut parts = encode_reply(1, &[ReplyItem::ok(0, vec![Bytes::new(), Bytes::new()])]);
        parts.pop();
        assert!(decode_reply(&parts).is_err(), "a missing value part");
        let mut bad_status = head(0, ReplyStatus::Ok, 0).to_vec();
        bad_status[4] = 9;
        assert!(decode_reply(&[key_part(1), Bytes::from(bad_status)]).is_err());
        let huge = head(0, ReplyStatus::Ok, u32::MAX as usize);
        assert!(decode_reply(&[key_part(1), huge]).is_err(), "no overflow");
    }

    #[test]
    fn items_round_trip_with_any_number_of_parts() {
        let items: Vec<ReplyItem> = (0..5)
            .map(|i| ReplyItem::ok(i, (0..i).map(|j| Bytes::from(vec![j as u8; 3])).collect()))
            .collect();
        let parts = encode_reply(u64::MAX, &items);
        assert_eq!(decode_reply(&parts).unwrap(), (u64::MAX, items));
        assert_eq!(ReplyItem::failed(2, "why").reason(), "why");
    }
}
