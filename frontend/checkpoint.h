/* checkpoint.h - a model's weights: one safetensors file or several shards,
 * looked up by tensor name across all of them.
 *
 *   st_checkpoint ck;
 *   if (!st_checkpoint_open("Llama-3-8B/", &ck, &diag)) return false;  // reported
 *   const st_tensor *t = st_checkpoint_find(&ck, "model.norm.weight");
 *   st_checkpoint_close(&ck);
 *
 * What `path` may be:
 *   - a safetensors file: the checkpoint is that file;
 *   - a GGUF file (it starts with "GGUF"): its tensors under Hugging Face
 *     names, dequantized on reading (gguf_model.h);
 *   - a file whose name ends in ".json": a Hugging Face index
 *     (model.safetensors.index.json) whose "weight_map" maps each tensor name
 *     to the shard holding it;
 *   - a folder: its model.safetensors.index.json if there is one, else its
 *     model.safetensors if there is one, else every *.safetensors file in it
 *     (in name order; at least one).
 *
 * Rules for an index. A shard name is a relative path that stays inside the
 * index's folder: it is normalised first ("sub/../b.safetensors" is
 * "b.safetensors"), then absolute paths and names that leave the folder
 * through ".." are refused, and so is a name whose folders (symbolic links
 * resolved) lie outside the folder's real path. The last component may be a
 * symbolic link to anywhere, as a single file and the files of a folder
 * may: a Hugging Face hub cache snapshot links every shard (and the index)
 * into ../../blobs. Each shard is opened once however many tensors name it
 * (or link to the same file). The
 * index and its shards must agree exactly: a tensor the index lists must be
 * in that shard, and a tensor a shard holds must be listed for that shard.
 * Both mismatches are errors, not warnings: they mean a mixed or partial
 * download, and guessing which side is right would load the wrong weights.
 *
 * In every form a tensor name may occur only once across all shards.
 */
#ifndef SMELT_CHECKPOINT_H
#define SMELT_CHECKPOINT_H

#include "safetensors.h"

typedef struct st_checkpoint {
    arena arena;
    const char *path;  /* as given */
    int32_t diag_file; /* diag file id of path */
    st_file *shards;   /* each opened once */
    uint32_t shard_count;
    const st_tensor **tensors; /* every tensor: shard order, then header order */
    uint32_t *tensor_shard;    /* shard index of each tensor */
    uint32_t tensor_count;
    uint32_t *slots;     /* open-addressing hash: tensor index + 1, 0 = empty */
    uint32_t slot_count; /* power of two */
    /* The GGUF file of a GGUF checkpoint (gguf_model.h), which has no shards; else NULL. */
    struct gguf_file *gguf;
} st_checkpoint;

/* Opens and checks every shard. Reports every problem; on false nothing is
 * left open (st_checkpoint_close on *out is still allowed). */
bool st_checkpoint_open(const char *path, st_checkpoint *out, diag_engine *d);
void st_checkpoint_close(st_checkpoint *ck);

const st_tensor *st_checkpoint_find(const st_checkpoint *ck, const char *name);
/* Index into ck->tensors of `name`, or UINT32_MAX. */
uint32_t st_checkpoint_index(const st_checkpoint *ck, const char *name);

#endif
