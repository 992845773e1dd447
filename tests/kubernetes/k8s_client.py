"""A monarch client using KubernetesJob, run by the tests in the client namespace.

``state``: get the job's meshes (through the state cache ``--cache``), optionally
spawn a proc per host and call an actor (``--call``: each proc answers its pod's IP);
``--attach-to ADDRESS``: out of cluster, through that worker's port (a gateway);
``kill``: kill the job saved in ``--cache``. Prints ``RESULT <json>``; on an error,
``ERROR <message>`` and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from monarch.actor import Actor, endpoint
from monarch.job import job_load
from monarch.job.kubernetes import ImageSpec, KubeConfig, KubernetesJob


class Where(Actor):
    @endpoint
    def pod_ip(self) -> str:
        return os.environ.get("POD_IP", "?")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["state", "kill"])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--mesh", default="trainers")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--image", help="provision the mesh with this image")
    parser.add_argument("--selector")
    parser.add_argument("--timeout", type=int)
    parser.add_argument("--cache")
    parser.add_argument("--call", action="store_true")
    parser.add_argument("--attach-to")
    args = parser.parse_args()
    try:
        if args.action == "kill":
            job = job_load(args.cache)
            job.kill()
            print("RESULT " + json.dumps({"killed": True}), flush=True)
            return 0
        job = KubernetesJob(
            args.namespace,
            timeout=args.timeout,
            kubeconfig=KubeConfig.from_path(args.kubeconfig),
            attach_to=args.attach_to,
        )
        if args.image:
            job.add_mesh(args.mesh, args.replicas, image_spec=ImageSpec(args.image))
        else:
            job.add_mesh(args.mesh, args.replicas, label_selector=args.selector)
        state = job.state(cached_path=args.cache)
        hosts = state[args.mesh]
        from monarch._src.actor import process

        result: dict[str, object] = {"sizes": dict(hosts.sizes), "client": process.get().proc_id}
        if args.call:
            procs = hosts.spawn_procs(per_host={"gpus": 1})
            where = procs.spawn("where", Where)
            result["ips"] = [ip for _, ip in where.pod_ip.call().get(timeout=60)]
            procs.stop().get(timeout=60)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    except Exception as e:
        print(f"ERROR {type(e).__name__}: {e}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
