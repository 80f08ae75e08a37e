/*
 * dk_kernel_reply: a reply's type, sending it signed to the peer that asked,
 * receiving a request, and the refusal of one whose fields have the wrong
 * types. See dk_kernel_state.h.
 */
#include "dk_kernel_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *kernel_reply_type_for(const char *request_type)
{
    size_t n = strlen(request_type);
    const char *suffix = "_request";
    size_t s = strlen(suffix);
    char *out = malloc(n + 2);
    if (!out)
        return NULL;
    if (n > s && strcmp(request_type + n - s, suffix) == 0) {
        memcpy(out, request_type, n - s);
        strcpy(out + n - s, "_reply");
    } else {
        strcpy(out, request_type);
    }
    return out;
}

/* Send REPLY_TYPE with CONTENT_JSON to the peer that sent REQ on SOCK. */
void kernel_send_reply_text(dk_kernel_t *k, zsock_t *sock, dk_msg_t *req, const char *reply_type,
                            const char *content_json)
{
    json_t *header = dk_header_new(reply_type, k->session, "kernel");
    char *header_text = json_dumps(header, JSON_COMPACT);
    char *parent_text = json_dumps(req->header, JSON_COMPACT);
    const char *parts[4] = {header_text, parent_text, "{}", content_json};
    size_t lens[4];
    for (int i = 0; i < 4; i++)
        lens[i] = parts[i] ? strlen(parts[i]) : 0;
    zmsg_t *msg = NULL;
    if (header_text && parent_text)
        msg = dk_wire_encode_raw(k->signer, req->idents, req->n_idents, parts, lens, NULL, 0);
    if (!msg || zmsg_send(&msg, sock) != 0)
        dk_log("could not send %s", reply_type);
    zmsg_destroy(&msg);
    free(header_text);
    free(parent_text);
    json_decref(header);
}

void kernel_send_reply(dk_kernel_t *k, zsock_t *sock, dk_msg_t *req, const char *reply_type,
                       json_t *content)
{
    char *text = json_dumps(content, JSON_COMPACT);
    if (text)
        kernel_send_reply_text(k, sock, req, reply_type, text);
    free(text);
}

/* Receive and decode one message from SOCK; NULL (logged) if it is refused. */
dk_msg_t *kernel_recv_msg(dk_kernel_t *k, zsock_t *sock, const char *channel)
{
    zmsg_t *raw = zmsg_recv(sock);
    if (!raw)
        return NULL;
    char err[256];
    dk_msg_t *msg = dk_wire_decode_zmsg(k->signer, k->replay, raw, err, sizeof err);
    if (!msg)
        dk_log("dropped a message on %s: %s", channel, err);
    zmsg_destroy(&raw);
    return msg;
}

/* A request expects a reply; the other shell messages the glue takes (comm
 * messages) do not. */
bool kernel_is_request(const char *t)
{
    size_t n = strlen(t);
    return n > 8 && strcmp(t + n - 8, "_request") == 0;
}

/* The reply content for a request whose fields have the wrong JSON types (WHY
 * from dk_wire_check_content): status "error", nothing of the request run. With
 * ERROR_OUT, the same error (without status) for iopub is returned there too. */
json_t *kernel_refusal(const char *why, json_t **error_out)
{
    char line[512];
    snprintf(line, sizeof line, "TypeError: %s", why);
    json_t *error = json_pack("{s:s, s:s, s:[s]}", "ename", "TypeError", "evalue", why,
                              "traceback", line);
    json_t *c = json_deep_copy(error);
    json_object_set_new(c, "status", json_string("error"));
    if (error_out)
        *error_out = error;
    else
        json_decref(error);
    return c;
}
