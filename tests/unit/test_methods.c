/* Unit tests for server/methods.c: the methods that change state (RPC_LOGGED), which a
 * replicated group logs, are exactly the updating ones, and each method has one row. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "methods.h"

static void test_logged_methods(void **state)
{
    (void)state;
    static const int logged[] = {
        PSD__V1__METHOD__CREATE_VARIABLE,
        PSD__V1__METHOD__PUSH,
        PSD__V1__METHOD__PUSH_PULL,
        PSD__V1__METHOD__ASSIGN,
        PSD__V1__METHOD__CLOCK,
        PSD__V1__METHOD__DELETE_VARIABLE,
        PSD__V1__METHOD__STEP,
        PSD__V1__METHOD__TABLE_CREATE,
        PSD__V1__METHOD__TABLE_PUSH,
    };
    size_t nlogged = sizeof(logged) / sizeof(logged[0]), seen = 0;
    for (size_t i = 0; i < server_methods_len; i++) {
        int m = server_methods[i].method;
        bool want = false;
        for (size_t k = 0; k < nlogged; k++)
            want = want || logged[k] == m;
        if (server_method_logged(m) != want)
            fail_msg("%s: logged %d, expected %d", server_methods[i].name,
                     (int)server_method_logged(m), (int)want);
        seen += want;
        for (size_t j = i + 1; j < server_methods_len; j++)
            assert_int_not_equal(server_methods[j].method, m);
    }
    assert_int_equal(seen, nlogged);
    /* Reads, admin reads and replication's own method are not logged; nor is an unknown one. */
    assert_false(server_method_logged(PSD__V1__METHOD__PULL));
    assert_false(server_method_logged(PSD__V1__METHOD__TABLE_PULL));
    assert_false(server_method_logged(PSD__V1__METHOD__CHECKPOINT));
    assert_false(server_method_logged(PSD__V1__METHOD__REPLICATE));
    assert_false(server_method_logged(-1));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logged_methods),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
