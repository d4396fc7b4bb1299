/* ref_ops_layout.c - the reference backend's layout ops: data moved, never
 * changed. They work on float and integer tensors alike, moving 4-byte
 * elements (ref_bytes); the result has the operand's element type.
 */
#include "ref_ops.h"

#include <string.h>

enum { ELEMENT = sizeof(float) };

/* reshape(x) -> shape: row-major, so the data is the same. */
bool ref_op_reshape(const ref_call *c) {
    memcpy(ref_bytes(&c->out[0]), ref_bytes(c->in[0]), c->in[0]->count * ELEMENT);
    return true;
}

/* transpose(x) {perm}: result dim i is x dim perm[i]. Walks the result in
 * order, stepping through x with its strides permuted. */
bool ref_op_transpose(const ref_call *c) {
    const ref_tensor *x = c->in[0];
    ref_tensor *y = &c->out[0];
    const unsigned char *from = ref_bytes(x);
    unsigned char *to = ref_bytes(y);
    uint64_t x_strides[IR_MAX_DIMS], strides[IR_MAX_DIMS], index[IR_MAX_DIMS] = {0};
    uint64_t stride = 1;
    for (int d = x->rank - 1; d >= 0; d--) {
        x_strides[d] = stride;
        stride *= x->dims[d];
    }
    for (unsigned i = 0; i < y->rank; i++)
        strides[i] = x_strides[c->attrs->perm[i]];
    uint64_t at = 0;
    for (uint64_t e = 0; e < y->count; e++) {
        memcpy(to + e * ELEMENT, from + at * ELEMENT, ELEMENT);
        for (int j = y->rank - 1; j >= 0; j--) { /* odometer over y's dims */
            at += strides[j];
            if (++index[j] < y->dims[j]) break;
            at -= strides[j] * y->dims[j];
            index[j] = 0;
        }
    }
    return true;
}

/* concat(xs...) {axis}: for each index of the dims before the axis, the
 * operands' blocks one after another. */
bool ref_op_concat(const ref_call *c) {
    ref_tensor *y = &c->out[0];
    unsigned axis = c->attrs->axis;
    uint64_t outer = ref_dims_product(y, 0, axis), inner = ref_dims_product(y, axis + 1, y->rank);
    unsigned char *to = ref_bytes(y);
    for (uint64_t o = 0; o < outer; o++) {
        for (uint32_t i = 0; i < c->in_count; i++) {
            uint64_t block = c->in[i]->dims[axis] * inner; /* elements of operand i per outer index */
            memcpy(to, ref_bytes(c->in[i]) + o * block * ELEMENT, block * ELEMENT);
            to += block * ELEMENT;
        }
    }
    return true;
}

/* split(x) {axis, sizes}: the inverse of concat, one result per size. */
bool ref_op_split(const ref_call *c) {
    const ref_tensor *x = c->in[0];
    unsigned axis = c->attrs->axis;
    uint64_t outer = ref_dims_product(x, 0, axis), inner = ref_dims_product(x, axis + 1, x->rank);
    const unsigned char *from = ref_bytes(x);
    for (uint64_t o = 0; o < outer; o++) {
        for (uint32_t r = 0; r < c->out_count; r++) {
            uint64_t block = c->out[r].dims[axis] * inner; /* elements of result r per outer index */
            memcpy(ref_bytes(&c->out[r]) + o * block * ELEMENT, from, block * ELEMENT);
            from += block * ELEMENT;
        }
    }
    return true;
}

/* slice(x) {axis, start, end}: indices [start, end) of the axis. */
bool ref_op_slice(const ref_call *c) {
    const ref_tensor *x = c->in[0];
    unsigned axis = c->attrs->axis;
    uint64_t outer = ref_dims_product(x, 0, axis), inner = ref_dims_product(x, axis + 1, x->rank);
    uint64_t length = x->dims[axis], kept = (uint64_t)(c->attrs->end - c->attrs->start);
    for (uint64_t o = 0; o < outer; o++)
        memcpy(ref_bytes(&c->out[0]) + o * kept * inner * ELEMENT,
               ref_bytes(x) + (o * length + (uint64_t)c->attrs->start) * inner * ELEMENT,
               kept * inner * ELEMENT);
    return true;
}
