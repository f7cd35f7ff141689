/* libFuzzer harness: the frame + envelope decoder (common/frame.c) and the input rules for
 * text (frame_check_strings, utf8_sanitize, quote_text) on arbitrary bytes. Build with
 * -Dfuzz=true (clang, -fsanitize=fuzzer,address,undefined); tests/fuzz/run.sh runs it. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>

#include "frame.h"
#include "status.h"
#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const ProtobufCMessageDescriptor *const bodies[] = {
    &psd__v1__create_variable_request__descriptor,
    &psd__v1__lookup_variable_request__descriptor,
    &psd__v1__list_variables_request__descriptor,
    &psd__v1__pull_request__descriptor,
    &psd__v1__push_request__descriptor,
    &psd__v1__server_status_request__descriptor,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nng_msg *m;
    if (nng_msg_alloc(&m, size) != 0)
        return 0;
    if (size)
        memcpy(nng_msg_body(m), data, size);
    frame f;
    memset(&f, 0, sizeof(f));
    char err[256];
    if (frame_parse(m, &f, err, sizeof(err)) == STATUS_OK) {
        const envelope *env = f.env;
        if (f.has_segment && f.segment_len > 0)
            (void)f.segment[f.segment_len - 1]; /* inside the message */
        for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
            int st =
                frame_check_strings(bodies[i], env->body.data, env->body.len, err, sizeof(err));
            ProtobufCMessage *b =
                protobuf_c_message_unpack(bodies[i], NULL, env->body.len, env->body.data);
            if (st == STATUS_OK && b) {
                /* What passed the rules is valid UTF-8 without NUL: messages built from it
                 * are too. */
                char q[400];
                quote_text(q, sizeof(q), env->message, 300);
                if (!utf8_text_ok(q, strlen(q), NULL))
                    abort();
            }
            if (b)
                protobuf_c_message_free_unpacked(b, NULL);
            if (st != STATUS_OK && !utf8_text_ok(err, strlen(err), NULL))
                abort(); /* error messages never carry raw bytes */
        }
        frame_fini(&f);
    }
    /* Arbitrary bytes through the escapers: the output is always valid UTF-8. */
    char *s = malloc(size + 1);
    if (s) {
        memcpy(s, data, size);
        s[size] = '\0';
        char out[512], q[512];
        utf8_sanitize(out, sizeof(out), s);
        quote_text(q, sizeof(q), s, 400);
        if (!utf8_text_ok(out, strlen(out), NULL) || !utf8_text_ok(q, strlen(q), NULL))
            abort();
        free(s);
    }
    nng_msg_free(m);
    return 0;
}
