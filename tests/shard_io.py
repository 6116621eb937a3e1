"""tests/shard_io.py: reads Strata's token shards (io/data.h) for the Python references:
llm.c's uint16 shards (magic 20240520, version 1), Strata's 32-bit ones (version 2, a loss
mask after the tokens when header[3] bit 0 is set: a byte per token, bit 0 learned, and with
header[3] bit 1, bit 1 the first token of a document), llm.c's Llama 3 ones (magic
20240801, version 7)."""
import array
import os
import sys


def read_shard(path):
    """(tokens, mask): mask is None for a shard without one."""
    with open(path, "rb") as f:
        b = f.read()
    header = array.array("i")
    header.frombytes(b[:1024])
    if sys.byteorder != "little":
        header.byteswap()
    magic, version, n, flags = header[0], header[1], header[2], header[3]
    wide = (magic, version) in ((20240520, 2), (20240801, 7))
    if not wide and (magic, version) != (20240520, 1):
        raise ValueError("%s: not a token shard (magic %d, version %d)" % (path, magic, version))
    toks = array.array("I" if wide else "H")
    toks.frombytes(b[1024:1024 + toks.itemsize * n])
    if sys.byteorder != "little":
        toks.byteswap()
    mask = None
    if wide and magic == 20240520 and flags & 1:
        mask = list(b[1024 + 4 * n:1024 + 5 * n])
    return list(toks), mask


def read_split(directory, prefix="train"):
    """Every <prefix>_NNNNNN.bin of directory in order: (tokens, masks, widths) as lists
    per shard."""
    out = []
    for name in sorted(os.listdir(directory)):
        if name.startswith(prefix + "_") and name.endswith(".bin"):
            toks, mask = read_shard(os.path.join(directory, name))
            out.append((name, toks, mask))
    return out


def read_ids(directory, prefix="train"):
    """The tokens of a split's shards, concatenated (shards written without overlap)."""
    ids = []
    for _, toks, _ in read_split(directory, prefix):
        ids.extend(toks)
    return ids
