/* launcher/help.c: per-subcommand usage (`strata COMMAND --help`, on stdout, exit 0) and
 * `strata --version`: the version and the libraries this binary was built with (CMake
 * passes the CUDA, NCCL and liburing versions; MPI, libyaml and PCRE2 report their own). */
#include "launcher/help.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <mpi.h>
#include <pcre2.h>
#include <stdio.h>
#include <string.h>
#include <yaml.h>

#include "core/common.h"

#ifndef STRATA_VERSION
#define STRATA_VERSION "unknown"
#endif
#ifndef STRATA_BUILD_CUDA
#define STRATA_BUILD_CUDA ""
#endif
#ifndef STRATA_BUILD_NCCL
#define STRATA_BUILD_NCCL ""
#endif
#ifndef STRATA_BUILD_URING
#define STRATA_BUILD_URING ""
#endif
#ifndef STRATA_BUILD_TYPE
#define STRATA_BUILD_TYPE ""
#endif

static const struct {
    const char *cmd, *text;
} helps[] = {
    {"train",
     "usage: strata train [CONFIG] [--set section.key=value]... [--resume latest|best|DIR]\n"
     "                    [--allow-new-tokenizer]\n"
     "\n"
     "Trains the model CONFIG describes (no CONFIG: the built-in quickstart, configs/quickstart.yaml).\n"
     "Under mpirun every rank runs it; ZeRO stage, offload and the rest come from the config.\n"
     "\n"
     "  CONFIG               a YAML file (`strata config CONFIG` prints every key with its default)\n"
     "  --set, -s S.K=V      override one key, checked like the file (repeatable)\n"
     "  --resume latest|best|DIR  continue bit for bit from run.dir's newest checkpoint, its one of\n"
     "                       the lowest validation loss (ckpt/best), or DIR; it wins over\n"
     "                       model.init_from. The model keys (n_head, ...) and the\n"
     "                       data's tokenizer must be the checkpoint's\n"
     "  --allow-new-tokenizer\n"
     "                       resume on data of another tokenizer (earlier checkpoints keep theirs)\n"
     "\n"
     "model.init_from: DIR|FILE.safetensors starts from Hugging Face weights: GPT-2, or the Llama family\n"
     "(Llama, Mistral, Qwen2, Qwen3); the model keys left out of the config come from its config.json.\n"
     "Exit codes: 0 ok, 1 run-time failure, 2 bad command line or config, 3 the plan does not fit,\n"
     "4 the device ran out of memory mid-run, 5 no progress for run.hang_timeout_s (the run ended rather\n"
     "than hang).\n"},
    {"prepare",
     "usage: strata prepare --text FILE... --out DIR [--tokenizer DIR|tokenizer.json]\n"
     "                      [--val-fraction F] [--shard-tokens N] [--threads N]\n"
     "       strata prepare --jsonl FILE... --out DIR --tokenizer T --seq-len N\n"
     "                      [--text-field F | --prompt-field P --response-field R |\n"
     "                       --messages-field M] [--chat-format llama3|chatml] [--system-prompt TEXT]\n"
     "                      [--pack best-fit|in-order] [--overflow split|truncate|drop] [--skip-bad] [--dedup]\n"
     "                      [--val-fraction F] [--val-split spread|end] [--shard-tokens N] [--threads N]\n"
     "\n"
     "Turns text files, or fine-tuning examples in JSON Lines, into token shards (DIR/train_000000.bin,\n"
     "DIR/val_...) and writes the tokenizer beside them as DIR/tokenizer.json (with its\n"
     "tokenizer_config.json: training records them, export ships them). Shards are llm.c's uint16\n"
     "format, or 32-bit when the vocabulary passes 65536 or the data has a loss mask (JSONL).\n"
     "\n"
     "  --text FILE...       UTF-8 text files (each file's tail goes to validation; each side is one\n"
     "                       document, with the tokens the tokenizer's template puts around one)\n"
     "  --jsonl FILE...      JSON Lines, one example an object (--val-fraction of each file's go to\n"
     "                       validation), packed into sequences of --seq-len tokens (the shards record\n"
     "                       it: training reads them with that train.seq_len only)\n"
     "                       Without a field option the first example's keys say which layout the\n"
     "                       file has: messages or conversations (a chat), prompt and completion lists\n"
     "                       of messages (TRL's), prompt with completion or response, instruction\n"
     "                       with output (Alpaca's), or text\n"
     "  --text-field F       a plain document in field F, all learned, its EOS after it\n"
     "  --prompt-field P     with --response-field R: P's tokens not learned, R's and the EOS learned;\n"
     "                       P may list fields (Alpaca's instruction,input): those there and not\n"
     "                       empty are joined by a blank line\n"
     "  --messages-field M   an array of {role: system|user|assistant, content} (or ShareGPT's\n"
     "                       {from: system|human|gpt, value}) in --chat-format: llama3 (Llama 3\n"
     "                       Instruct's template) or chatml (Qwen's), by default the one whose\n"
     "                       special tokens the tokenizer has; only assistant turns are learned;\n"
     "                       the template goes into tokenizer_config.json. M,N (TRL's\n"
     "                       prompt,completion): N's messages after M's, only N's assistant turns learned\n"
     "  --system-prompt TEXT a chat whose first message is not the system's gets this one first (not\n"
     "                       learned), and the template beside the shards does the same at inference\n"
     "                       (as Qwen2.5's own puts its default one)\n"
     "  --seq-len N          the training sequence length: examples are packed into sequences of it,\n"
     "                       the room they leave padded (not learned); the shards mark where each\n"
     "                       starts, and a run keeps them apart (data.document_mask)\n"
     "  --pack best-fit|in-order  best-fit (the default) fills up to 64 sequences at once, each example\n"
     "                       into the one it leaves the least room in: little padding; in-order starts\n"
     "                       a new sequence whenever an example does not fit the current one\n"
     "  --overflow split|truncate|drop  an example longer than --seq-len runs on into the next\n"
     "                       sequences (split, the default: each part starts one, without what came\n"
     "                       before it), keeps its first --seq-len tokens (truncate; left out if they\n"
     "                       learn nothing), or is left out (drop); the count of each is printed\n"
     "  --skip-bad           skip a malformed line and count it; without it the first one stops prepare\n"
     "  --dedup              drop an example that repeats an earlier one (the same tokens, the same of them\n"
     "                       learned), so none is both trained and validated on; without it they are\n"
     "                       kept, and counted\n"
     "                       (exit 2) naming file, line and field\n"
     "  --out DIR            written beside it and swapped in whole once complete: a failure leaves the\n"
     "                       old data as it was; its other files are kept, earlier shards are not. One\n"
     "                       prepare per DIR at a time: a second exits 2, naming the first\n"
     "  --tokenizer T        a Hugging Face BPE (GPT-2, Llama 3, Qwen2/2.5/3, Llama 2, Mistral,\n"
     "                       TinyLlama): tokenizer.json, or a model directory with tokenizer.json (and\n"
     "                       tokenizer_config.json) or vocab.json + merges.txt; the ids are those Hugging\n"
     "                       Face `tokenizers` gives. Without it tokens are bytes (vocab_size 256).\n"
     "  --val-fraction F     share of each file held out for validation, in [0, 1) (default 0.1)\n"
     "  --val-split spread|end  JSONL: which examples of each file are held out: spread over it (the\n"
     "                       default: those whose line index hashes lowest) or its last ones\n"
     "  --shard-tokens N     tokens per shard at most (default 100000000)\n"
     "  --threads N          threads that tokenize (default: the CPUs prepare may run on): JSONL's\n"
     "                       lines, a batch at a time; a text file in parts cut after a newline, when\n"
     "                       the tokenizer's pieces never cross one (GPT-2's, Llama 3's, Qwen's; one\n"
     "                       thread for others). The shards are the same for any N\n"},
    {"config",
     "usage: strata config [CONFIG] [--set section.key=value]...\n"
     "       strata config --from-deepspeed ds_config.json [--world N] [--base CONFIG]\n"
     "\n"
     "Prints the effective config: every key, with defaults and a comment each (no CONFIG: the\n"
     "built-in quickstart).\n"
     "\n"
     "  --from-deepspeed F   print the Strata YAML equivalent to DeepSpeed config F (ZeRO stage,\n"
     "                       offload, overlap, buckets, batch, bf16, AdamW, scheduler, clipping) and\n"
     "                       name every key that cannot be carried over, and why (also on stderr)\n"
     "  --world N            ranks, to derive gradient accumulation from train_batch_size (default 1)\n"
     "  --base CONFIG        start the printed YAML with `base: CONFIG`, so it loads as is\n"},
    {"plan",
     "usage: strata plan [CONFIG] [--world N] [--set section.key=value]...\n"
     "                   [--gpu-gb G] [--host-gb H] [--nvme-gb N]\n"
     "\n"
     "Prints the memory plan of one rank per tier (device, pinned host, host, NVMe) without\n"
     "training; when it does not fit, the cheapest change that does (exit 3).\n"
     "\n"
     "  --world N            ranks (default 1)\n"
     "  --gpu-gb, --host-gb, --nvme-gb   budgets in GiB (shorthands for memory.*_gb; default: queried)\n"},
    {"sample",
     "usage: strata sample CKPT|RUNDIR|HF_MODEL [--prompt TEXT | --prompts FILE] [--chat [--system TEXT]] [--tokens N]\n"
     "                     [--temperature T] [--top-k K] [--seed S] [--tokenizer T] [--context N]\n"
     "                     [--device cpu|cuda] [--weights auto|device|host]\n"
     "\n"
     "Generates text from a checkpoint (a run directory means its newest one; RUNDIR/ckpt/best the one of\n"
     "the lowest validation loss), or from a Hugging Face model (a directory with config.json, such as an\n"
     "export or a downloaded model, or a .safetensors file) with its tokenizer.json. Special tokens are\n"
     "printed as their text; the BOS a tokenizer puts before a text is not. It loads the weights alone\n"
     "(no gradients, no optimizer state, none of the run's offload) and says on stderr what they take\n"
     "where.\n"
     "\n"
     "  --prompt TEXT        encoded with the run's tokenizer, as tokenizer(TEXT) (its BOS first; refused\n"
     "                       if a token falls outside the model's vocabulary)\n"
     "  --chat               TEXT as a user's message in the chat format the run's data was prepared\n"
     "                       with (prepare --chat-format), the assistant's header after it; stops at the\n"
     "                       end of the assistant's turn; after the default system message the data\n"
     "                       was prepared with (prepare --system-prompt), if any\n"
     "                       (a Hugging Face model: Llama 3 Instruct's format or ChatML, as its special\n"
     "                       tokens say)\n"
     "  --system TEXT        with --chat: a system message before the prompt, instead of that default\n"
     "  --prompts FILE       a JSONL file of prompts, a line each: {\"prompt\": TEXT} (with --chat,\n"
     "                       \"system\" too if it likes); writes a JSON line for each, in its order:\n"
     "                       {\"prompt\", \"completion\" (the text generated; with --chat up to the end of\n"
     "                       the turn, left out), \"tokens\", \"stopped\" (the turn ended)}\n"
     "  --tokens N           tokens to generate (default 200)\n"
     "  --temperature T      0 = greedy (default 1)\n"
     "  --top-k K            sample among the K most likely (default 0: all)\n"
     "  --seed S             (default 1337)\n"
     "  --tokenizer T        tokenizer.json, a model directory, or llm.c's tokenizer .bin (decoding only);\n"
     "                       default: the tokenizer.json the run recorded in its run directory\n"
     "  --context N          the most tokens the model sees at once (default: the model's context, at\n"
     "                       most 8192); the activations are planned for it\n"
     "  --device D           cpu or cuda (default: the run's; a Hugging Face model's: cuda when a GPU answers)\n"
     "  --weights W          where the blocks' weights live: auto (default) the GPU as many as fit, the\n"
     "                       others in pinned host memory, copied in for each forward; device all on the\n"
     "                       GPU (refused when they do not fit); host every block copied in\n"},
    {"chat",
     "usage: strata chat CKPT|RUNDIR|HF_MODEL [--system TEXT] [--tokens N] [--temperature T] [--top-k K]\n"
     "                   [--seed S] [--tokenizer T] [--context N] [--device cpu|cuda] [--weights auto|device|host]\n"
     "\n"
     "A conversation with a chat model (a run on data prepared with --chat-format, or a Hugging Face\n"
     "model whose tokenizer speaks Llama 3 Instruct's or ChatML's format): each line of stdin is a user's\n"
     "message, each reply goes to stdout as it is made, then a newline (its special tokens as text, the\n"
     "turn's end left out), the conversation so far the context of the next reply, its keys and values\n"
     "kept from one reply to the next; it ends at the end of stdin. On a terminal it\n"
     "prompts with \"> \" on stderr. The options are strata sample's (sample --help): --tokens bounds a\n"
     "reply, --system replaces the default system message; the conversation keeps its last --context\n"
     "tokens.\n"},
    {"eval",
     "usage: strata eval CKPT|RUNDIR|HF_MODEL [--data GLOB] [--batches N] [--micro-batch B] [--seq-len T]\n"
     "                   [--device cpu|cuda] [--weights auto|device|host] [--json]\n"
     "\n"
     "The loss (and perplexity) of a checkpoint, or of a Hugging Face model (a directory with config.json,\n"
     "or a .safetensors file), on token shards, computed as a run's validation computes it: the mean over\n"
     "the learned targets (the loss mask of fine-tuning data), packed documents each attending within\n"
     "itself, the sequences in the data's order. From the weights alone, as sample loads them. A run's\n"
     "checkpoint on its own data.val with its micro-batch and --batches train.eval_batches gives the\n"
     "validation loss the run recorded.\n"
     "\n"
     "  --data GLOB          token shards (strata prepare); default: the run's data.val\n"
     "  --batches N          micro-batches to evaluate (default: every whole one the data holds)\n"
     "  --micro-batch B      sequences a forward (default: the run's train.micro_batch; a Hugging Face\n"
     "                       model's: 1)\n"
     "  --seq-len T          tokens a sequence (default: what the shards were packed to, else the run's,\n"
     "                       else the model's context up to 1024)\n"
     "  --device D           cpu or cuda (default: the run's; a Hugging Face model's: cuda when a GPU answers)\n"
     "  --weights W          auto, device or host: as strata sample --help says\n"
     "  --json               one JSON object: loss, perplexity, batches, micro_batch, seq_len, tokens,\n"
     "                       learned_tokens, seconds\n"},
    {"plot",
     "usage: strata plot RUNDIR... [--out FILE]\n"
     "\n"
     "Draws RUNDIR/metrics.jsonl as one self-contained SVG: train and validation loss with the\n"
     "learning rate, tokens/s and step time, the gradient norm, and memory per tier by category\n"
     "as planned, against each tier's capacity and the peak measured. Several runs are overlaid,\n"
     "one colour each, with a legend (at most 16). Default output: RUNDIR/plot.svg for one run,\n"
     "./plot.svg for several.\n"},
    {"bench",
     "usage: strata bench io [--nvme-dir DIR] [--block-kb N] [--queue-depth N] [--mb N] [--device cpu|cuda]\n"
     "\n"
     "Measures this machine's offload floors: pinned and pageable host<->device copies, and\n"
     "O_DIRECT reads and writes through io_uring in DIR.\n"},
    {"export",
     "usage: strata export CKPT|RUNDIR --out DIR [--max-shard-size SIZE]\n"
     "       strata export CKPT|RUNDIR --out FILE.safetensors\n"
     "\n"
     "Writes the fp32 weights of a checkpoint (a run directory means its newest one; RUNDIR/ckpt/best\n"
     "the one of the lowest validation loss) under Hugging Face's names for the model's family.\n"
     "--out DIR (created) is a directory `AutoModelForCausalLM.from_pretrained(DIR)` (GPT2LMHeadModel,\n"
     "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM, as\n"
     "model.hf_model_type says) and `AutoTokenizer.from_pretrained(DIR)` load unchanged: config.json,\n"
     "generation_config.json, model.safetensors (or model-0000K-of-0000N.safetensors shards with\n"
     "model.safetensors.index.json past --max-shard-size, default 5GB), and the tokenizer the run\n"
     "trained with (tokenizer.json and tokenizer_config.json; for GPT-2 also vocab.json and merges.txt).\n"
     "--out FILE.safetensors writes the weights alone.\n"
     "\n"
     "  --max-shard-size SIZE  largest weights file, e.g. 5GB, 500MB, 2GiB (default 5GB)\n"},
    {"dump-grads",
     "usage: strata dump-grads CKPT|RUNDIR --data GLOB --out FILE.safetensors [--batch B] [--seq T]\n"
     "                         [--device cpu|cuda] [--set section.key=value]...\n"
     "\n"
     "One forward and backward of the checkpoint's model over the first B sequences of GLOB:\n"
     "loss, logits, inputs, targets and every gradient, for checks against PyTorch\n"
     "(tests/torch_reference.py). --device cuda computes in bf16 (default: fp32 on the CPU).\n"},
};

int strata_help_asked(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return 1;
    return 0;
}

int strata_cmd_help(const char *cmd) {
    for (size_t i = 0; i < sizeof helps / sizeof helps[0]; i++) {
        if (!strcmp(helps[i].cmd, cmd)) {
            fputs(helps[i].text, stdout);
            return 0;
        }
    }
    return -1;
}

int strata_cmd_version(void) {
    printf("strata %s%s%s\n", STRATA_VERSION, STRATA_BUILD_TYPE[0] ? " (" : "", STRATA_BUILD_TYPE[0] ? STRATA_BUILD_TYPE ")" : "");
    printf("  CUDA      %s\n", STRATA_BUILD_CUDA[0] ? "toolkit " STRATA_BUILD_CUDA : "not built: CPU backend only");
    printf("  NCCL      %s\n", STRATA_BUILD_NCCL[0] ? STRATA_BUILD_NCCL : "not built (comm.backend nccl unavailable)");
    char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0, major = 0, minor = 0;
    MPI_Get_library_version(mpi, &len); /* both may be called before MPI_Init */
    MPI_Get_version(&major, &minor);
    char *nl = strchr(mpi, '\n');
    if (nl) *nl = 0;
    char *comma = strchr(mpi, ','); /* Open MPI appends package details after a comma */
    if (comma) *comma = 0;
    printf("  MPI       %s (MPI %d.%d)\n", mpi, major, minor);
    printf("  io_uring  liburing %s\n", STRATA_BUILD_URING[0] ? STRATA_BUILD_URING : "(version unknown)");
    printf("  YAML      libyaml %s\n", yaml_get_version_string());
    char pcre[64] = "?";
    pcre2_config(PCRE2_CONFIG_VERSION, pcre);
    printf("  regex     PCRE2 %s\n", pcre);
    return STRATA_EXIT_OK;
}
