"""Lightning 2.6 on the "ringcomm" backend, 2 CPU processes:

    torchrun --nproc-per-node 2 examples/clients/train_lightning.py --variant ddp --out OUT

Variants: ddp (DDPStrategy) and model_parallel (ModelParallelStrategy: FSDP2
fully_shard over the data-parallel dimension of Lightning's device mesh, 2 x 1). Each passes
process_group_backend=--backend; Lightning hands it to init_process_group,
where torch finds "ringcomm" through ringcomm's entry point (no import of
ringcomm here). Lightning's FSDPStrategy (torch's FSDP1) refuses CPU
accelerators, whatever the backend ("requires a GPU accelerator").
"""
import torch
import torch.distributed as dist

import lightning.pytorch as pl
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

import common


class Batches(torch.utils.data.Dataset):
    """Item i of rank r's shard is common.batch(i, r): Lightning's DistributedSampler
    (no shuffle) gives rank r the items r, r + 2, ..., so each item is one batch."""

    def __init__(self, steps, world_size):
        self.steps, self.world_size = steps, world_size

    def __len__(self):
        return self.steps * self.world_size

    def __getitem__(self, i):
        return common.batch(i // self.world_size, i % self.world_size)


class Net(pl.LightningModule):
    def __init__(self, width, variant):
        super().__init__()
        self.variant = variant
        self.net = common.mlp(width)
        self.losses = []

    def configure_model(self):
        if self.variant == "model_parallel":
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            for layer in self.net:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(self.net, mesh=mesh)

    def training_step(self, item, index):
        x, y = item
        loss = torch.nn.functional.mse_loss(self.net(x[0]), y[0])
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Timing(pl.Callback):
    def __init__(self):
        self.timer = common.StepTimer()

    def on_train_batch_start(self, trainer, module, batch, index):
        self.timer.start()

    def on_train_batch_end(self, trainer, module, outputs, batch, index):
        self.timer.stop()


def full_params(module):
    if module.variant == "model_parallel":
        return [p.full_tensor() for p in module.net.parameters()]
    return list(module.net.parameters())


def main():
    args = common.parser(__doc__.splitlines()[0], ["ddp", "model_parallel"]).parse_args()
    torch.set_num_threads(1)
    if args.variant == "ddp":
        strategy = DDPStrategy(process_group_backend=args.backend)
    else:  # its default mesh is (nodes, processes): data parallel across 2 processes needs saying so
        strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1,
                                         process_group_backend=args.backend)
    timing = Timing()
    trainer = pl.Trainer(accelerator="cpu", devices=2, num_nodes=1, strategy=strategy, max_steps=args.steps,
                         callbacks=[timing], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    module = Net(args.width, args.variant)
    loader = torch.utils.data.DataLoader(Batches(args.steps, 2), batch_size=1, shuffle=False)
    trainer.fit(module, loader)
    params = full_params(module)
    common.write(args.out, dist.get_rank(), backend=dist.get_backend(), losses=module.losses, params=params,
                 step_times=timing.timer.times, group=type(dist.group.WORLD).__name__)


if __name__ == "__main__":
    main()
