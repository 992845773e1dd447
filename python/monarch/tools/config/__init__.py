"""Configuration of what a job runs: :class:`Workspace`, the local directories (and the
environment) that ``HostMesh.sync_workspace`` mirrors to the hosts; see
[Code on the hosts](../workspace.md).

The errors a sync raises are here too: :class:`WorkspacePathError` (a path that would
leave the workspace) and :class:`HostOutOfSpaceError` (a host short of space).
"""

from monarch._src.actor.code_sync import HostOutOfSpaceError, WorkspacePathError
from monarch._src.actor.workspace import CondaEnvironment, Environment, Workspace

__all__ = [
    "CondaEnvironment",
    "Environment",
    "HostOutOfSpaceError",
    "Workspace",
    "WorkspacePathError",
]
