/* io/tensorboard.h: TensorBoard event files, written natively: no protobuf or TensorFlow
 * library, only the few messages a run needs, encoded by hand.
 *
 * A file `events.out.tfevents.<time>.<host>` is a sequence of records, each
 *   uint64 length | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data
 * (little-endian; TensorFlow's mask: ((crc >> 15) | (crc << 17)) + 0xa282ead8), whose data
 * are `Event` messages (tensorflow/core/util/event.proto):
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
 *   Summary { repeated Value value = 1; }
 *   Value   { string tag = 1; float simple_value = 2; TensorProto tensor = 8; SummaryMetadata metadata = 9; }
 * The first record says `file_version: "brain.Event:2"`; each step is one Event holding
 * every scalar of the step; text (the memory plan) is a Value with a scalar DT_STRING
 * tensor and metadata naming the "text" plugin, byte for byte what TensorBoard's own
 * `text_pb` makes, so its text plugin renders it as Markdown.
 *
 * Resuming: a run that resumes from step S keeps, in every events file of its directory,
 * the records of steps up to S (those of later steps, and the memory plan text at S that
 * the resumed run writes again, are dropped), each file rewritten through a temporary
 * name and renamed only where something changes, then appends to the newest. A record
 * cut short by a killed run, or one whose checksum is wrong, ends what is kept of its
 * file (TensorBoard's reader stops there too), so nothing is ever appended after a torn
 * record; the steps it took (up to S) are written again by the trainer from metrics.jsonl
 * (strata_tb_last_kept says from where). A fresh run removes the events files an earlier run left there, as it rewrites
 * metrics.jsonl.
 *
 * Writes go out a record at a time with write(2), and a write that fails cuts the file
 * back to its last whole record, so the file stays readable whatever fills the disk. */
#ifndef STRATA_TENSORBOARD_H
#define STRATA_TENSORBOARD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "io/text.h"

/* ---- the encoding (the writer's pieces, also what the unit test checks byte for byte) ---- */

/* TensorFlow's masked CRC-32C of data[0, len). */
uint32_t strata_tb_masked_crc(const void *data, size_t len);
/* Appends data[0, len) to out as one record (header, its CRC, data, its CRC). */
void strata_tb_frame(strata_sbuf *out, const void *data, size_t len);

/* One scalar of a step. */
typedef struct strata_tb_scalar {
    const char *tag;
    float value;
} strata_tb_scalar;

/* The Event messages, appended to out. A step of 0 is left out, as protobuf leaves out
 * every field at its default. */
void strata_tb_event_file_version(strata_sbuf *out, double wall_time);
void strata_tb_event_scalars(strata_sbuf *out, double wall_time, int64_t step, const strata_tb_scalar *v, int n);
void strata_tb_event_text(strata_sbuf *out, double wall_time, int64_t step, const char *tag, const char *text);

/* ---- reading (what a resume needs, and the tests) ---- */

/* Reads the next record of f into data (its bytes replace what data held): 1; 0 at the
 * end of the file; -1 when the bytes there are no whole record, why saying which (cut
 * short, a checksum that does not match, a length over 1 GiB, a read error). */
int strata_tb_read_record(FILE *f, strata_sbuf *data, const char **why);
/* An Event's step (0 when absent) and whether any of its summary values carries plugin
 * metadata (text does, scalars do not). 0, or -1 when data is not an Event protobuf. */
int strata_tb_event_info(const unsigned char *data, size_t len, int64_t *step, int *has_metadata);

/* ---- the writer ---- */

typedef struct strata_tb_writer strata_tb_writer;

/* Opens the events of a run in dir (made if missing). resume_step < 0: a fresh run, which
 * removes earlier events files there (saying so) and starts a new one with its
 * file_version record; otherwise the files are cut back to resume_step as above and the
 * newest is appended to (a new one when there is none). 0 with *out set, or -1 + error
 * naming the file (on a failed cut-back the original file is untouched). */
int strata_tb_open(strata_tb_writer **out, const char *dir, int64_t resume_step);
/* The file being written, for messages. */
const char *strata_tb_path(const strata_tb_writer *w);
/* After a resume's cut-back: the newest step whose scalars the files kept (0: none). Below
 * the resumed step when a torn record took the last ones; the caller writes them again
 * from what it kept elsewhere (metrics.jsonl), so no step goes missing. */
int64_t strata_tb_last_kept(const strata_tb_writer *w);
/* One Event of a step's scalars, stamped with the wall clock. 0, or -1 + error naming the
 * file and errno, the file cut back to its last whole record. */
int strata_tb_write_scalars(strata_tb_writer *w, int64_t step, const strata_tb_scalar *v, int n);
/* One Event of text (Markdown) under tag; the same failure contract. */
int strata_tb_write_text(strata_tb_writer *w, int64_t step, const char *tag, const char *text);
/* Closes and frees (w may be NULL): 0, or -1 + error when the close reports a failure. */
int strata_tb_close(strata_tb_writer *w);

#endif
