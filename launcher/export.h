/* launcher/export.h: `strata export` and `strata dump-grads`, the two doors between a
 * Strata checkpoint and the Python ecosystem.
 *
 *   strata export CKPT|RUNDIR --out DIR [--max-shard-size SIZE]
 *       a directory `GPT2LMHeadModel.from_pretrained` and `AutoTokenizer.from_pretrained`
 *       load unchanged: config.json, generation_config.json, the weights as
 *       model.safetensors or, past SIZE (default 5GB), model-0000K-of-0000N.safetensors
 *       with model.safetensors.index.json, and the tokenizer the run recorded
 *       (launcher/tokenizer.h) as tokenizer.json, vocab.json + merges.txt and
 *       tokenizer_config.json. Weight files of an earlier export into DIR that this one
 *       did not write are removed.
 *   strata export CKPT|RUNDIR --out FILE.safetensors
 *       the weights alone.
 *   Weights are the fp32 master weights under Hugging Face GPT-2 names (the LM head is
 *   tied to transformer.wte.weight, so lm_head.weight is not written), wte cut to the
 *   real vocab_size rows.
 *   strata dump-grads CKPT|RUNDIR --data GLOB --out FILE.safetensors [--batch B] [--seq T]
 *       one forward and backward on the CPU backend over the first B sequences of GLOB
 *       (read as the trainer reads them, from sequence 0, unshuffled): "loss" (1), "logits"
 *       (B,T,V), "inputs" and "targets" (B,T) int32, and "grad.<name>" for every parameter.
 *       tests/torch_reference.py compares all of it with PyTorch.
 *
 * Both files carry "__metadata__" {"format": "pt", "strata.step", "strata.n_layer", ...,
 * "strata.config": the checkpoint's YAML}. Every file is written atomically (temporary
 * name, fsync, rename). */
#ifndef STRATA_EXPORT_H
#define STRATA_EXPORT_H

int strata_cmd_export(int argc, char **argv);
int strata_cmd_dump_grads(int argc, char **argv);

#endif
