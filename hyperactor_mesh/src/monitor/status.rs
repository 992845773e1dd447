//! The status of each kind of record: one enum per kind, serialized as the API's
//! lowercase names (`"running"`, `"alive"`, ...), exactly the strings of version 1.

use hyperactor::ActorStatus;
use serde::{Deserialize, Serialize};

/// Implements `as_str`, `Display` and comparisons with the API's names for a status enum.
macro_rules! status_names {
    ($ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every status, in the order of the API's documentation.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// Its name in the API (what it serializes to).
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl PartialEq<str> for $ty {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }

        impl PartialEq<&str> for $ty {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }
    };
}

/// The status of a host ([`HostRecord::status`](super::HostRecord::status)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostStatus {
    /// Its agent answers, or no heartbeat judged it lost.
    Alive,
    /// Its agent stopped answering heartbeats.
    Lost,
}

status_names!(HostStatus {
    Alive => "alive",
    Lost => "lost",
});

/// The status of a proc ([`ProcRecord::status`](super::ProcRecord::status)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcStatus {
    /// Its process runs.
    Running,
    /// It was stopped on request.
    Stopped,
    /// Its process exited with code 0 while no stop was asked for.
    Exited,
    /// Its process exited with an error or was killed by a signal.
    Failed,
    /// Its host lost it (or it was killed on request).
    Lost,
}

status_names!(ProcStatus {
    Running => "running",
    Stopped => "stopped",
    Exited => "exited",
    Failed => "failed",
    Lost => "lost",
});

/// The status of a mesh ([`MeshRecord::status`](super::MeshRecord::status)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MeshStatus {
    /// Spawned and not stopped; none of its ranks failed.
    Running,
    /// Stopped on request.
    Stopped,
    /// One of its ranks failed.
    Failed,
}

status_names!(MeshStatus {
    Running => "running",
    Stopped => "stopped",
    Failed => "failed",
});

/// The state of an actor ([`ActorRecord::status`](super::ActorRecord::status)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActorState {
    /// Spawned, or running `new`/`init`.
    Initializing,
    /// Waiting for a message.
    Idle,
    /// Handling a message.
    Processing,
    /// Stopping its children.
    Stopping,
    /// Stopped gracefully.
    Stopped,
    /// Failed.
    Failed,
}

status_names!(ActorState {
    Initializing => "initializing",
    Idle => "idle",
    Processing => "processing",
    Stopping => "stopping",
    Stopped => "stopped",
    Failed => "failed",
});

impl From<&ActorStatus> for ActorState {
    /// The state the API shows for an actor in `status`.
    fn from(status: &ActorStatus) -> Self {
        match status {
            ActorStatus::Created | ActorStatus::Initializing => ActorState::Initializing,
            ActorStatus::Idle => ActorState::Idle,
            ActorStatus::Processing => ActorState::Processing,
            ActorStatus::Stopping => ActorState::Stopping,
            ActorStatus::Stopped => ActorState::Stopped,
            ActorStatus::Failed(_) => ActorState::Failed,
            _ => ActorState::Idle,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every status serializes to its API name and parses back from it.
    fn round_trip<T>(all: &[T], names: &[&str]) -> Result<(), serde_json::Error>
    where
        T: Serialize + for<'de> Deserialize<'de> + PartialEq + std::fmt::Debug + std::fmt::Display,
    {
        assert_eq!(all.len(), names.len());
        for (status, name) in all.iter().zip(names) {
            assert_eq!(serde_json::to_string(status)?, format!("\"{name}\""));
            assert_eq!(status.to_string(), *name);
            let back: T = serde_json::from_str(&format!("\"{name}\""))?;
            assert_eq!(&back, status);
        }
        Ok(())
    }

    #[test]
    fn every_status_keeps_its_api_name() -> Result<(), Box<dyn std::error::Error>> {
        round_trip(HostStatus::ALL, &["alive", "lost"])?;
        round_trip(
            ProcStatus::ALL,
            &["running", "stopped", "exited", "failed", "lost"],
        )?;
        round_trip(MeshStatus::ALL, &["running", "stopped", "failed"])?;
        round_trip(
            ActorState::ALL,
            &[
                "initializing",
                "idle",
                "processing",
                "stopping",
                "stopped",
                "failed",
            ],
        )?;
        assert!(serde_json::from_str::<ProcStatus>("\"alive\"").is_err());
        assert_eq!(ProcStatus::Lost, "lost");
        assert_eq!(
            ActorState::from(&ActorStatus::Failed("boom".into())),
            ActorState::Failed
        );
        assert_eq!(ActorState::from(&ActorStatus::Created), "initializing");
        // Bincode (between agents) carries them too.
        let bytes = bincode::serialize(&ActorState::Stopping)?;
        assert_eq!(
            bincode::deserialize::<ActorState>(&bytes)?,
            ActorState::Stopping
        );
        Ok(())
    }
}
