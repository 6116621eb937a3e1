/* launcher/dump_grads.h: `strata dump-grads`, a checkpoint's loss, logits and gradients on
 * one batch, for checks against PyTorch.
 *
 *   strata dump-grads CKPT|RUNDIR --data GLOB --out FILE.safetensors [--batch B] [--seq T]
 *                     [--device cpu|cuda] [--set section.key=value]...
 *       one forward and backward (fp32 on the CPU backend; --device cuda: bf16 on the GPU)
 *       over the first B sequences of GLOB (read as the trainer reads them, from sequence
 *       0, unshuffled): "loss" (1), "logits" (B,T,V), "inputs" and "targets" (B,T) int32,
 *       and "grad.<name>" for every parameter. tests/torch_reference.py compares all of it
 *       with PyTorch.
 *
 * The file carries the checkpoint's metadata as `strata export` writes it, with
 * "strata.batch", "strata.seq_len" and "strata.wte_padding_grad_max_abs" (the gradient
 * of wte's padding rows, which must be 0), and is written atomically. Returns an exit
 * code. */
#ifndef STRATA_DUMP_GRADS_H
#define STRATA_DUMP_GRADS_H

int strata_cmd_dump_grads(int argc, char **argv);

#endif
