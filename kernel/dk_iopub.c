/*
 * dk_iopub: serialised publishing on the IOPub socket. See dk_iopub.h for why a
 * mutex and not a publisher thread.
 */
#include "dk_iopub.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct dk_iopub_t {
    zsock_t *pub;
    const dk_signer_t *signer;
    char *session;
    char *parent;           /* current parent header, JSON text */
    pthread_mutex_t lock;
};

dk_iopub_t *dk_iopub_new(zsock_t *pub, const dk_signer_t *signer, const char *session)
{
    dk_iopub_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->pub = pub;
    self->signer = signer;
    self->session = strdup(session);
    self->parent = strdup("{}");
    pthread_mutex_init(&self->lock, NULL);
    if (!self->session || !self->parent) {
        dk_iopub_destroy(&self);
        return NULL;
    }
    return self;
}

void dk_iopub_destroy(dk_iopub_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    dk_iopub_t *self = *self_p;
    pthread_mutex_destroy(&self->lock);
    free(self->session);
    free(self->parent);
    free(self);
    *self_p = NULL;
}

void dk_iopub_set_parent(dk_iopub_t *self, const char *parent_json)
{
    char *copy = strdup(parent_json ? parent_json : "{}");
    if (!copy)
        return;
    pthread_mutex_lock(&self->lock);
    free(self->parent);
    self->parent = copy;
    pthread_mutex_unlock(&self->lock);
}

char *dk_iopub_parent(dk_iopub_t *self)
{
    pthread_mutex_lock(&self->lock);
    char *copy = strdup(self->parent);
    pthread_mutex_unlock(&self->lock);
    return copy;
}

const char *dk_iopub_session(const dk_iopub_t *self)
{
    return self->session;
}

int dk_iopub_publish_text(dk_iopub_t *self, const char *msg_type, const char *content_json,
                          const char *metadata_json, const char *parent_json,
                          zframe_t *const *buffers, size_t n_buffers)
{
    json_t *header = dk_header_new(msg_type, self->session, "kernel");
    char *header_text = header ? json_dumps(header, JSON_COMPACT) : NULL;
    json_decref(header);
    if (!header_text)
        return -1;

    zframe_t *topic = zframe_new(msg_type, strlen(msg_type));
    pthread_mutex_lock(&self->lock);
    const char *parent = parent_json ? parent_json : self->parent;
    const char *parts[4] = {header_text, parent, metadata_json ? metadata_json : "{}",
                            content_json};
    size_t lens[4];
    for (int i = 0; i < 4; i++)
        lens[i] = strlen(parts[i]);
    zmsg_t *msg = dk_wire_encode_raw(self->signer, &topic, 1, parts, lens, buffers, n_buffers);
    int rc = -1;
    if (msg)
        rc = zmsg_send(&msg, self->pub);
    pthread_mutex_unlock(&self->lock);
    zmsg_destroy(&msg);
    zframe_destroy(&topic);
    free(header_text);
    return rc == 0 ? 0 : -1;
}

int dk_iopub_publish(dk_iopub_t *self, const char *msg_type, json_t *content,
                     const char *parent_json)
{
    char *text = json_dumps(content, JSON_COMPACT);
    if (!text)
        return -1;
    int rc = dk_iopub_publish_text(self, msg_type, text, NULL, parent_json, NULL, 0);
    free(text);
    return rc;
}

int dk_iopub_status(dk_iopub_t *self, const char *state, const char *parent_json)
{
    char content[64];
    snprintf(content, sizeof content, "{\"execution_state\":\"%s\"}", state);
    return dk_iopub_publish_text(self, "status", content, NULL, parent_json, NULL, 0);
}
