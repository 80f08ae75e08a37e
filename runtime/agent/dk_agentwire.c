/*
 * dk_agentwire: the agent's side of one connection, over dk_frame. See the
 * header.
 */
#include "dk_agentwire.h"

#include <string.h>

int dk_agentwire_init(dk_agentwire_t *w, const unsigned char *key, const unsigned char *nonce,
                      unsigned char dir_out, size_t max_payload)
{
    memset(w, 0, sizeof *w);
    if (!(w->key = dk_frame_key_new(key)))
        return -1;
    dk_frame_side_init(&w->side, w->key, nonce, dir_out);
    w->max_payload = max_payload;
    return 0;
}

void dk_agentwire_clear(dk_agentwire_t *w)
{
    dk_frame_key_destroy(&w->key);
    memset(&w->side, 0, sizeof w->side);
}

int dk_agentwire_key_from_hex(const char *hex, unsigned char key[DK_AGENTWIRE_KEY_LEN])
{
    return dk_frame_key_from_hex(hex, key);
}

size_t dk_agentwire_seal(dk_agentwire_t *w, int type, uint32_t id, const void *payload,
                         size_t len, unsigned char *out)
{
    return dk_frame_seal(&w->side, type, id, payload, len, out);
}

long dk_agentwire_open(dk_agentwire_t *w, const unsigned char *buf, size_t len,
                       dk_agentframe_t *f, size_t *need, const char **why)
{
    return dk_frame_open(&w->side, buf, len, w->max_payload, f, need, why);
}
