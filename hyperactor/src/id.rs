//! Identifiers of procs, actors and ports.
//!
//! Every reference in hyperactor carries its own location: there is no name service.
//!
//! - A [`ProcId`] is a unique id plus the [`ChannelAddr`] the proc listens on.
//! - An [`ActorId`] is a proc, an actor name and an index (several actors may share a
//!   name in one proc; the index tells them apart).
//! - A [`PortId`] is an actor plus a port number.
//!
//! Each id has exactly one printable form, and that form parses back to the same id
//! (ID-1). The forms read as a path from the proc down to the port:
//!
//! ```text
//! ProcId   uid@addr                       worker-3f2a@unix:/tmp/hyperactor-1.sock
//! ActorId  uid@addr/name[index]           worker-3f2a@tcp:127.0.0.1:4000/trainer[0]
//! PortId   uid@addr/name[index]:port      worker-3f2a@local:7/trainer[0]:12
//! ```
//!
//! ```
//! use hyperactor::id::{ActorId, PortId};
//!
//! let port: PortId = "w1@tcp:[::1]:4000/trainer[2]:17".parse().unwrap();
//! assert_eq!(port.actor().name(), "trainer");
//! assert_eq!(port.actor().index(), 2);
//! assert_eq!(port.to_string(), "w1@tcp:[::1]:4000/trainer[2]:17");
//! ```
//!
//! Names (proc uids and actor names) are non-empty and may not contain `@`, `/`, `[`,
//! `]`, `:` or whitespace; [`validate_name`] checks this and is applied by every
//! constructor that takes a name from a user.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::channel::ChannelAddr;
use crate::error::IdError;

/// Checks that `name` can be used as a proc uid or an actor name.
///
/// # Errors
///
/// Returns [`IdError::InvalidName`] if the name is empty or contains one of the reserved
/// characters `@ / [ ] :` or whitespace.
pub fn validate_name(name: &str) -> Result<(), IdError> {
    let bad = name.is_empty()
        || name
            .chars()
            .any(|c| matches!(c, '@' | '/' | '[' | ']' | ':') || c.is_whitespace());
    if bad {
        return Err(IdError::InvalidName {
            name: name.to_string(),
        });
    }
    Ok(())
}

/// The id of a proc: a unique id plus the address it listens on. Clones share one
/// allocation (ids are copied into every message header).
///
/// Hashing a proc id costs one word after the first time: the hash of its contents is
/// kept in the shared allocation. (A proc id is a key of the tables a cast goes
/// through once per receiver, and its address, a socket path, is slow to hash.)
#[derive(Clone)]
pub struct ProcId(Arc<ProcIdCell>);

struct ProcIdCell {
    id: ProcIdInner,
    /// The hash of `id`, once computed; 0 until then.
    hash: AtomicU64,
}

#[derive(PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
struct ProcIdInner {
    uid: String,
    addr: ChannelAddr,
}

impl ProcId {
    fn of(id: ProcIdInner) -> Self {
        Self(Arc::new(ProcIdCell {
            id,
            hash: AtomicU64::new(0),
        }))
    }

    /// The hash of the id's contents: the same for equal ids in this process (a hasher
    /// with fixed keys), computed once per allocation.
    fn content_hash(&self) -> u64 {
        let cached = self.0.hash.load(Ordering::Relaxed);
        if cached != 0 {
            return cached;
        }
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&self.0.id, &mut hasher);
        let hash = std::hash::Hasher::finish(&hasher).max(1);
        self.0.hash.store(hash, Ordering::Relaxed);
        hash
    }
}

impl PartialEq for ProcId {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.id == other.0.id
    }
}

impl Eq for ProcId {}

impl PartialOrd for ProcId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ProcId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.id.cmp(&other.0.id)
    }
}

impl std::hash::Hash for ProcId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.content_hash());
    }
}

impl Serialize for ProcId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.id.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ProcId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Self::of(ProcIdInner::deserialize(deserializer)?))
    }
}

impl ProcId {
    /// Creates a proc id from a uid and an address.
    ///
    /// # Errors
    ///
    /// Returns [`IdError::InvalidName`] if `uid` is not a valid name ([`validate_name`]).
    pub fn new(uid: impl Into<String>, addr: ChannelAddr) -> Result<Self, IdError> {
        let uid = uid.into();
        validate_name(&uid)?;
        Ok(Self::of(ProcIdInner { uid, addr }))
    }

    /// Creates a proc id whose uid is `prefix` followed by a suffix unique to this
    /// process and call (so two procs started from the same name never collide).
    ///
    /// # Errors
    ///
    /// Returns [`IdError::InvalidName`] if `prefix` is not a valid name.
    pub fn unique(prefix: &str, addr: ChannelAddr) -> Result<Self, IdError> {
        validate_name(prefix)?;
        Self::new(format!("{prefix}-{}", unique_suffix()), addr)
    }

    /// The unique id part.
    pub fn uid(&self) -> &str {
        &self.0.id.uid
    }

    /// The address the proc listens on.
    pub fn addr(&self) -> &ChannelAddr {
        &self.0.id.addr
    }

    /// The id of the actor `name[index]` in this proc.
    ///
    /// # Errors
    ///
    /// Returns [`IdError::InvalidName`] if `name` is not a valid name.
    pub fn actor_id(&self, name: &str, index: u64) -> Result<ActorId, IdError> {
        validate_name(name)?;
        Ok(ActorId {
            proc: self.clone(),
            name: Name(Arc::from(name)),
            index,
        })
    }
}

/// The id of an actor: its proc, its name and its index among actors of that name.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ActorId {
    proc: ProcId,
    name: Name,
    index: u64,
}

/// An actor name, shared by the clones of an id (ids are copied into every message
/// header); serialized as a string.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Name(Arc<str>);

impl Serialize for Name {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Self(Arc::from(String::deserialize(deserializer)?)))
    }
}

impl ActorId {
    /// The proc this actor lives in.
    pub fn proc_id(&self) -> &ProcId {
        &self.proc
    }

    /// The actor's name.
    pub fn name(&self) -> &str {
        &self.name.0
    }

    /// The actor's index among actors of the same name in its proc.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The id of port `port` of this actor.
    pub fn port_id(&self, port: u64) -> PortId {
        PortId {
            actor: self.clone(),
            port,
        }
    }
}

/// The id of a port: an actor plus a port number.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PortId {
    actor: ActorId,
    port: u64,
}

impl PortId {
    /// The actor that owns the port.
    pub fn actor(&self) -> &ActorId {
        &self.actor
    }

    /// The port number.
    pub fn index(&self) -> u64 {
        self.port
    }
}

fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    // FNV-1a over (pid, time, counter): short, well spread, no extra dependency.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for word in [u64::from(std::process::id()), nanos, n] {
        for b in word.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{:012x}", h & 0xffff_ffff_ffff)
}

impl fmt::Display for ProcId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.0.id.uid, self.0.id.addr)
    }
}

impl fmt::Display for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}[{}]", self.proc, self.name.0, self.index)
    }
}

impl fmt::Display for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.actor, self.port)
    }
}

macro_rules! debug_as_display {
    ($($t:ty),*) => {$(
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($t), self)
            }
        }
    )*};
}
debug_as_display!(ProcId, ActorId, PortId);

fn parse_error(input: &str, expected: &'static str) -> IdError {
    IdError::Parse {
        input: input.to_string(),
        expected,
    }
}

impl FromStr for ProcId {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const EXPECTED: &str = "a proc id of the form `uid@transport:address`";
        let (uid, addr) = s.split_once('@').ok_or_else(|| parse_error(s, EXPECTED))?;
        let addr: ChannelAddr = addr.parse().map_err(|_| parse_error(s, EXPECTED))?;
        Self::new(uid, addr).map_err(|_| parse_error(s, EXPECTED))
    }
}

/// Splits `name[index]` into its parts.
fn parse_actor_part(part: &str) -> Option<(&str, u64)> {
    let (name, rest) = part.split_once('[')?;
    let index = rest.strip_suffix(']')?.parse().ok()?;
    validate_name(name).ok()?;
    Some((name, index))
}

impl FromStr for ActorId {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const EXPECTED: &str = "an actor id of the form `uid@transport:address/name[index]`";
        let (proc, actor) = s.rsplit_once('/').ok_or_else(|| parse_error(s, EXPECTED))?;
        let proc: ProcId = proc.parse().map_err(|_| parse_error(s, EXPECTED))?;
        let (name, index) = parse_actor_part(actor).ok_or_else(|| parse_error(s, EXPECTED))?;
        proc.actor_id(name, index)
            .map_err(|_| parse_error(s, EXPECTED))
    }
}

impl FromStr for PortId {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const EXPECTED: &str = "a port id of the form `uid@transport:address/name[index]:port`";
        let (actor, port) = s.rsplit_once(':').ok_or_else(|| parse_error(s, EXPECTED))?;
        let port: u64 = port.parse().map_err(|_| parse_error(s, EXPECTED))?;
        let actor: ActorId = actor.parse().map_err(|_| parse_error(s, EXPECTED))?;
        Ok(actor.port_id(port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs() -> Vec<ChannelAddr> {
        vec![
            "local:7".parse().unwrap(),
            "unix:/tmp/some dir/x.sock".parse().unwrap(),
            "tcp:127.0.0.1:4000".parse().unwrap(),
            "tcp:[::1]:4000".parse().unwrap(),
        ]
    }

    fn hash_of<T: std::hash::Hash>(value: &T) -> u64 {
        use std::hash::{BuildHasher, RandomState};
        // One state for every value: a map's hasher, not the id's own.
        thread_local!(static STATE: RandomState = RandomState::new());
        STATE.with(|s| s.hash_one(value))
    }

    #[test]
    fn equal_proc_ids_hash_alike_whichever_allocation_and_whenever_hashed() {
        let addr: ChannelAddr = "unix:/tmp/hyperactor-0/1-0-ab.sock".parse().unwrap();
        let a = ProcId::new("worker-1", addr.clone()).unwrap();
        let parsed: ProcId = a.to_string().parse().unwrap();
        let decoded: ProcId = bincode::deserialize(&bincode::serialize(&a).unwrap()).unwrap();
        // The first hash of `a` computes and keeps it; the others compute their own.
        let first = hash_of(&a);
        assert_eq!(
            hash_of(&a),
            first,
            "the kept hash differs from the computed one"
        );
        assert_eq!(hash_of(&parsed), first);
        assert_eq!(hash_of(&decoded), first);
        assert_eq!(a, parsed);
        assert_eq!(a, decoded);
        let other = ProcId::new("worker-2", addr).unwrap();
        assert_ne!(a, other);
        assert_ne!(hash_of(&other), first);
        // As keys: an id found through an equal id of another allocation.
        let mut seqs = std::collections::HashMap::new();
        seqs.insert(a.clone(), 1);
        seqs.insert(other.clone(), 2);
        assert_eq!(seqs.get(&decoded), Some(&1));
        let mut ids = vec![other.clone(), a.clone()];
        ids.sort();
        assert_eq!(ids, vec![a, other], "ids order by uid, then address");
    }

    #[test]
    fn id1_print_parse_round_trip() {
        for addr in addrs() {
            let proc = ProcId::new("worker-1", addr).unwrap();
            let actor = proc.actor_id("trainer", 3).unwrap();
            let port = actor.port_id(42);
            assert_eq!(proc.to_string().parse::<ProcId>().unwrap(), proc, "ID-1");
            assert_eq!(actor.to_string().parse::<ActorId>().unwrap(), actor, "ID-1");
            assert_eq!(port.to_string().parse::<PortId>().unwrap(), port, "ID-1");
        }
    }

    #[test]
    fn id1_printed_forms_are_stable() {
        let proc = ProcId::new("w", "tcp:127.0.0.1:9".parse().unwrap()).unwrap();
        let port = proc.actor_id("a", 0).unwrap().port_id(5);
        assert_eq!(port.to_string(), "w@tcp:127.0.0.1:9/a[0]:5");
        assert_eq!(
            format!("{:?}", port.actor()),
            "ActorId(w@tcp:127.0.0.1:9/a[0])"
        );
    }

    #[test]
    fn bad_ids_are_rejected_with_the_expected_form() {
        for bad in [
            "",
            "noat",
            "w@nowhere:1",
            "w@local:1/a",
            "w@local:1/a[x]",
            "w@local:1/[0]",
        ] {
            let err = bad.parse::<ActorId>().unwrap_err();
            assert!(err.to_string().contains("name[index]"), "{err}");
        }
        assert!("w@local:1/a[0]:x".parse::<PortId>().is_err());
        assert!("w@local:1/a[0]".parse::<PortId>().is_err());
    }

    #[test]
    fn reserved_characters_in_names_are_rejected() {
        let proc = ProcId::new("w", "local:1".parse().unwrap()).unwrap();
        for bad in ["", "a/b", "a@b", "a[b", "a:b", "a b"] {
            assert!(proc.actor_id(bad, 0).is_err(), "{bad:?} accepted");
        }
        assert!(ProcId::new("a@b", "local:1".parse().unwrap()).is_err());
    }

    #[test]
    fn unique_proc_ids_differ() {
        let addr: ChannelAddr = "local:1".parse().unwrap();
        let a = ProcId::unique("p", addr.clone()).unwrap();
        let b = ProcId::unique("p", addr).unwrap();
        assert_ne!(a, b);
        assert!(a.uid().starts_with("p-"));
    }

    #[test]
    fn ids_round_trip_through_serde() {
        let port = ProcId::new("w", "unix:/tmp/x".parse().unwrap())
            .unwrap()
            .actor_id("a", 1)
            .unwrap()
            .port_id(2);
        let bytes = bincode::serialize(&port).unwrap();
        assert_eq!(bincode::deserialize::<PortId>(&bytes).unwrap(), port);
    }
}
