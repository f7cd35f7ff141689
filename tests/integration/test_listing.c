/* Integration: listings past the envelope's 1 MiB bound. One ps-server with the default
 * max-message-bytes (64 MiB) holds 4,000 variables with 255-byte names (a listing of about
 * 1.1 MB). ListVariables answers a valid page under 1 MiB for every page size (an empty
 * request, 0, 2^32-1, 25,000, 30,000, 500), cut by the server with a next token, and the
 * pages list every variable once; ServerStatus with max_variables 40,000 is a valid truncated
 * reply; `psctl vars` lists them all; the server logs no INTERNAL. Arguments: ps-server, psctl. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "cluster_proc.h"
#include "ps_proc.h"

#define NVARS 4000

static const char *server_bin, *psctl_bin;
static test_ps ps;
static ps_client *client;
static nng_socket sock;

static void long_name(char *buf, int i)
{
    int n = snprintf(buf, PS_MAX_NAME + 1, "list/%05d/", i);
    memset(buf + n, 'x', (size_t)(PS_MAX_NAME - n));
    buf[PS_MAX_NAME] = '\0';
}

static int setup(void **state)
{
    (void)state;
    test_ps_init(&ps, server_bin, "psd-listing");
    test_ps_start(&ps, NULL);
    client = test_ps_open_client(&ps, NULL, NULL);
    if (client == NULL)
        return -1;
    for (int i = 0; i < NVARS; i++) {
        char name[PS_MAX_NAME + 1];
        long_name(name, i);
        if (test_make_var(client, name, 1) == NULL)
            return -1;
    }
    sock = test_raw_dial(ps.port, 20000);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    nng_close(sock);
    ps_client_close(client);
    test_ps_signal_wait(&ps, SIGTERM, 0);
    /* Nothing answered INTERNAL (it is always logged). */
    assert_false(test_file_contains(ps.log, "INTERNAL"));
    test_ps_cleanup(&ps);
    return 0;
}

/* Lists every page with page_size (raw requests; with_body false: an empty request body) and
 * checks each reply: OK, under 1 MiB, names in order after the token. Returns the count. */
static size_t list_all(uint32_t page_size, bool with_body, size_t *pages)
{
    char *token = NULL;
    char last[PS_MAX_NAME + 1] = "";
    size_t total = 0;
    *pages = 0;
    for (;;) {
        Psd__V1__ListVariablesRequest r = PSD__V1__LIST_VARIABLES_REQUEST__INIT;
        r.page_size = page_size;
        r.page_token = token ? token : "";
        uint8_t body[512];
        envelope env = PSD__V1__ENVELOPE__INIT;
        env.method = PSD__V1__METHOD__LIST_VARIABLES;
        env.request_id = *pages + 1;
        if (with_body || token) {
            env.body.len = psd__v1__list_variables_request__pack(&r, body);
            env.body.data = body;
        }
        frame f;
        nng_msg *m;
        int status = test_raw_request(sock, &env, NULL, 0, &f, &m);
        if (status != 0)
            fail_msg("ListVariables page_size %u page %zu: status %d: %s", page_size, *pages,
                     status, status > -1000 ? f.env->message : "no reply");
        assert_true(nng_msg_len(m) <= FRAME_MAX_ENVELOPE + FRAME_HEADER_SIZE);
        Psd__V1__ListVariablesReply *rep =
            psd__v1__list_variables_reply__unpack(NULL, f.env->body.len, f.env->body.data);
        assert_non_null(rep);
        assert_true(rep->n_variables > 0);
        if (page_size > 0)
            assert_true(rep->n_variables <= page_size);
        for (size_t i = 0; i < rep->n_variables; i++) {
            assert_true(strcmp(rep->variables[i]->name, last) > 0);
            snprintf(last, sizeof(last), "%s", rep->variables[i]->name);
        }
        total += rep->n_variables;
        (*pages)++;
        free(token);
        token = NULL;
        bool more = rep->next_page_token && rep->next_page_token[0];
        if (more) {
            assert_string_equal(rep->next_page_token, last);
            token = strdup(rep->next_page_token);
        }
        psd__v1__list_variables_reply__free_unpacked(rep, NULL);
        frame_fini(&f);
        nng_msg_free(m);
        if (!more)
            break;
        assert_true(*pages < NVARS);
    }
    return total;
}

static void test_every_page_size(void **state)
{
    (void)state;
    size_t pages;
    assert_int_equal(list_all(0, false, &pages), NVARS); /* an empty request */
    assert_true(pages >= 2);                             /* 1.1 MB: cut by the server */
    const uint32_t sizes[] = {0, UINT32_MAX, 25000, 30000, 500};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        assert_int_equal(list_all(sizes[i], true, &pages), NVARS);
        if (sizes[i] == 500)
            assert_int_equal(pages, NVARS / 500);
        else
            assert_true(pages >= 2);
    }
}

static void test_status_many_variables(void **state)
{
    (void)state;
    const uint32_t wants[] = {40000, 0, UINT32_MAX};
    for (size_t i = 0; i < sizeof(wants) / sizeof(wants[0]); i++) {
        Psd__V1__ServerStatusRequest r = PSD__V1__SERVER_STATUS_REQUEST__INIT;
        r.max_variables = wants[i];
        uint8_t body[64];
        envelope env = PSD__V1__ENVELOPE__INIT;
        env.method = PSD__V1__METHOD__SERVER_STATUS;
        env.request_id = 100 + i;
        env.body.len = psd__v1__server_status_request__pack(&r, body);
        env.body.data = body;
        frame f;
        nng_msg *m;
        int status = test_raw_request(sock, &env, NULL, 0, &f, &m);
        if (status != 0)
            fail_msg("ServerStatus max_variables %u: status %d: %s", wants[i], status,
                     status > -1000 ? f.env->message : "no reply");
        assert_true(nng_msg_len(m) <= FRAME_MAX_ENVELOPE + FRAME_HEADER_SIZE);
        Psd__V1__ServerStatusReply *rep =
            psd__v1__server_status_reply__unpack(NULL, f.env->body.len, f.env->body.data);
        assert_non_null(rep);
        assert_int_equal(rep->num_variables, NVARS);
        assert_true(rep->n_variables > 0);
        if (wants[i] != 0) {
            assert_true(rep->n_variables < NVARS); /* cut to fit */
            assert_true(rep->variables_truncated);
        }
        psd__v1__server_status_reply__free_unpacked(rep, NULL);
        frame_fini(&f);
        nng_msg_free(m);
    }
}

static void test_psctl_vars(void **state)
{
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "'%s' --cluster '%s' vars", psctl_bin, ps.spec);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[1024];
    size_t listed = 0;
    while (fgets(line, sizeof(line), p))
        listed += strncmp(line, "list/", 5) == 0 || strstr(line, " list/") != NULL;
    int rc = pclose(p);
    assert_true(WIFEXITED(rc));
    assert_int_equal(WEXITSTATUS(rc), 0);
    assert_int_equal(listed, NVARS);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    if (argc < 3) {
        fprintf(stderr, "usage: %s PS_SERVER PSCTL\n", argv[0]);
        return 2;
    }
    psctl_bin = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_page_size),
        cmocka_unit_test(test_status_many_variables),
        cmocka_unit_test(test_psctl_vars),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
