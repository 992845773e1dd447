"""Kubernetes jobs: :class:`KubernetesJob` gets its host meshes from pods, either
provisioned through the MonarchMesh custom resource (``image_spec=`` /
``pod_template=``) or pre-provisioned and found by label selector. Guide:
[Kubernetes](../kubernetes.md).

Needs the ``kubernetes`` package (``pip install kubernetes``); importing this module
does not import it, constructing a :class:`KubernetesJob` does.
"""

from monarch._src.job.kubernetes import ImageSpec as ImageSpec
from monarch._src.job.kubernetes import KubeConfig as KubeConfig
from monarch._src.job.kubernetes import KubernetesJob as KubernetesJob

__all__ = ["ImageSpec", "KubeConfig", "KubernetesJob"]
