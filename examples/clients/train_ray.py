"""Ray Train 2.60 on the "ringcomm" backend, 2 CPU workers:

    python examples/clients/train_ray.py --out OUT

TorchTrainer with ScalingConfig(num_workers=2, use_gpu=False) and
TorchConfig(backend=--backend): Ray starts the workers, sets MASTER_ADDR to the
node's address (not loopback) and calls init_process_group with that backend,
where torch finds "ringcomm" through ringcomm's entry point (installed in the
environment the workers run in: no import of ringcomm here). prepare_model wraps
the model in DDP. Ray is started here, on this machine only (ray.init with 2 CPUs,
no dashboard).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def train_loop(config):
    import torch.distributed as dist
    from ray import train
    from ray.train.torch import prepare_model

    sys.path.insert(0, config["here"])
    import common as c

    torch.set_num_threads(1)
    rank = train.get_context().get_world_rank()
    model = prepare_model(c.mlp(config["width"]), move_to_device=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    timer, losses = c.StepTimer(), []
    for step in range(config["steps"]):
        timer.start()
        x, y = c.batch(step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        timer.stop()
        losses.append(loss.item())
    c.write(config["out"], rank, backend=dist.get_backend(), losses=losses, params=list(model.module.parameters()),
            step_times=timer.times, group=type(dist.group.WORLD).__name__,
            master_addr=os.environ.get("MASTER_ADDR"))


def main():
    args = common.parser(__doc__.splitlines()[0], ["torch_trainer"]).parse_args()
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={"steps": args.steps, "width": args.width, "out": os.path.abspath(args.out),
                               "here": os.path.dirname(os.path.abspath(__file__))},
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
            torch_config=TorchConfig(backend=args.backend),
            run_config=RunConfig(storage_path=os.path.join(os.path.abspath(args.out), "ray"), name="run"),
        )
        trainer.fit()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
