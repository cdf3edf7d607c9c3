"""Hugging Face transformers 5.23 Trainer on the "ringcomm" backend, 2 CPU processes:

    torchrun --nproc-per-node 2 examples/clients/train_transformers.py --out OUT

A 2-layer GPT-2 built from a config in code (no download), trained by the stock
Trainer for --steps steps, one batch of token ids per rank per step.

The Trainer gets its process group from accelerate's PartialState, which on CPU
processes picks the backend itself (MPI if torch has it, else gloo) and refuses any
other (accelerate/state.py, `_prepare_backend`: "Your assigned backend ringcomm is
not available, please use gloo"); TrainingArguments passes `ddp_backend` straight to
it, and its command-line form lists only torch's built-in names in its argparse
choices. What PartialState does honour is a default group that already exists
(it initialises one only when torch.distributed.is_initialized() is false), and
`accelerator_config={"use_configured_state": True}` has TrainingArguments take that
state as it is. So the program makes the ringcomm group, then PartialState(cpu=True),
then the Trainer, with use_cpu=True (what makes a multi-process CPU job one job).
With --backend gloo the program leaves everything to the Trainer, as stock
transformers does.
"""
import os

import torch
import torch.distributed as dist

import common

VOCAB, SEQ = 64, 16


class Tokens(torch.utils.data.Dataset):
    """steps x world batches of token ids, fixed by their index; the Trainer's
    seeded sampler and accelerate's sharding of the loader deal them to the ranks
    alike on every backend."""

    def __init__(self, count, n=4):
        self.items = []
        for i in range(count):
            g = torch.Generator().manual_seed(1000 + i)
            self.items.append(torch.randint(0, VOCAB, (n, SEQ), generator=g))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {"input_ids": self.items[i], "labels": self.items[i]}


def main():
    args = common.parser(__doc__.splitlines()[0], ["trainer"]).parse_args()
    torch.set_num_threads(1)
    from accelerate import PartialState
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    extra = {}
    if args.backend != "gloo":
        dist.init_process_group(args.backend)  # RANK, WORLD_SIZE, MASTER_* from torchrun
        PartialState(cpu=True)
        extra["accelerator_config"] = {"use_configured_state": True}
    rank = int(os.environ["RANK"])

    torch.manual_seed(7)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0, eos_token_id=0, n_embd=args.width, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    losses, timer = [], common.StepTimer()

    class Record(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            timer.start()

        def on_step_end(self, a, state, control, **kw):
            timer.stop()

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(logs["loss"])

    out = os.path.join(args.out, f"trainer{rank}")
    training = TrainingArguments(
        output_dir=out, use_cpu=True, per_device_train_batch_size=1, max_steps=args.steps, learning_rate=1e-3,
        lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to=[], seed=7, data_seed=7,
        dataloader_num_workers=0, disable_tqdm=True, ddp_backend=None if args.backend != "gloo" else "gloo",
        **extra)

    def collate(items):
        return {k: items[0][k] for k in items[0]}  # one item: a batch of 4 sequences

    trainer = Trainer(model=model, args=training, train_dataset=Tokens(args.steps * int(os.environ["WORLD_SIZE"])),
                      data_collator=collate, callbacks=[Record()])
    trainer.train()
    params = list(trainer.accelerator.unwrap_model(trainer.model).parameters())
    common.write(args.out, rank, backend=dist.get_backend(), losses=losses, params=params, step_times=timer.times,
                 group=type(dist.group.WORLD).__name__, world=dist.get_world_size(),
                 shared_losses=True)  # the Trainer logs the mean over the ranks


if __name__ == "__main__":
    main()
