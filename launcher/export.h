/* launcher/export.h: `strata export`, one of the two doors between a Strata checkpoint and
 * the Python ecosystem (the other is `strata dump-grads`, launcher/dump_grads.h).
 *
 *   strata export CKPT|RUNDIR --out DIR [--max-shard-size SIZE]
 *       a directory `AutoModelForCausalLM.from_pretrained` and
 *       `AutoTokenizer.from_pretrained` load unchanged: config.json (GPT2LMHeadModel's, or
 *       the Llama family's under model.hf_model_type: LlamaForCausalLM, MistralForCausalLM,
 *       Qwen2ForCausalLM, Qwen3ForCausalLM), generation_config.json, the weights as
 *       model.safetensors or, past SIZE (default 5GB), model-0000K-of-0000N.safetensors
 *       with model.safetensors.index.json, and the tokenizer the run recorded
 *       (launcher/tokenizer.h) as tokenizer.json and tokenizer_config.json (GPT-2:
 *       GPT2Tokenizer, with vocab.json + merges.txt; the Llama family:
 *       PreTrainedTokenizerFast). Weight files of an earlier export into DIR that this one
 *       did not write are removed.
 *   strata export CKPT|RUNDIR --out FILE.safetensors
 *       the weights alone.
 *   Weights are the fp32 master weights under Hugging Face's names (a tied LM head is not
 *   written: GPT-2's is transformer.wte.weight, a tied Llama's model.embed_tokens.weight),
 *   the embedding and an untied lm_head.weight cut to the real vocab_size rows.
 * Every file carries "__metadata__" {"format": "pt", "strata.step", "strata.n_layer", ...,
 * "strata.config": the checkpoint's YAML} and is written atomically (temporary name,
 * fsync, rename). */
#ifndef STRATA_EXPORT_H
#define STRATA_EXPORT_H

int strata_cmd_export(int argc, char **argv);

#endif
