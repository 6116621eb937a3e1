/* launcher/deepspeed.h: `strata config --from-deepspeed ds_config.json [--world N]
 * [--base CONFIG]`, a DeepSpeed user's config read in.
 *
 * Prints, on stdout, the Strata YAML that trains the same way: ZeRO stage, optimizer and
 * parameter offload (device, nvme_path, buffer_count, aio block size and queue depth),
 * overlap_comm, reduce_bucket_size, micro-batch per GPU and accumulation (derived from
 * train_batch_size with --world), bf16, AdamW (DeepSpeed's defaults written out where the
 * file leaves them, since Strata's differ), the WarmupLR / WarmupDecayLR /
 * WarmupCosineLR schedulers, gradient clipping, communication dtype and steps_per_print.
 * Each line says which DeepSpeed key it came from. Every key that cannot be carried over
 * is named with the reason, as comments at the end and on stderr; an "auto" value (the
 * Hugging Face Trainer's placeholder) is one of them.
 *
 * The printed keys are checked as the config loader checks them, on top of --base (or the
 * built-in default): a result Strata would refuse is exit 2 with the loader's message.
 * Unreadable or invalid JSON, or a value of the wrong type, is exit 2 naming the file and
 * the key (or the byte offset). */
#ifndef STRATA_DEEPSPEED_H
#define STRATA_DEEPSPEED_H

int strata_cmd_config_deepspeed(int argc, char **argv);

#endif
