/* The intrusive list (common/list.h): order of pushes at both ends and of
 * inserts after a node, removal from the middle and twice, walking with
 * removal, and an element in two lists at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/list.h"

typedef struct {
  int v;
  tsr_list a, b; /* in two lists */
} item;

/* The values along list `head` (member a), as digits: "132". */
static const char *order(const tsr_list *head) {
  static char buf[32];
  size_t n = 0;
  tsr_list_foreach(it, head) {
    buf[n++] = (char)('0' + tsr_list_entry(it, item, a)->v);
  }
  buf[n] = 0;
  return buf;
}

static void pushes_and_inserts_keep_order(void **state) {
  (void)state;
  item it[5] = {{.v = 0}, {.v = 1}, {.v = 2}, {.v = 3}, {.v = 4}};
  tsr_list h;
  tsr_list_init(&h);
  assert_true(tsr_list_empty(&h));
  assert_null(tsr_list_first(&h));
  assert_null(tsr_list_last(&h));
  assert_false(tsr_list_linked(&it[0].a)); /* zeroed: not linked */
  tsr_list_push_back(&h, &it[1].a);
  tsr_list_push_back(&h, &it[2].a);
  tsr_list_push_front(&h, &it[0].a);
  tsr_list_insert_after(&it[2].a, &it[4].a);
  tsr_list_insert_after(&it[2].a, &it[3].a);
  assert_string_equal(order(&h), "01234");
  assert_ptr_equal(tsr_list_first(&h), &it[0].a);
  assert_ptr_equal(tsr_list_last(&h), &it[4].a);
  assert_ptr_equal(tsr_list_next(&h, &it[1].a), &it[2].a);
  assert_null(tsr_list_next(&h, &it[4].a));
  assert_ptr_equal(tsr_list_prev(&h, &it[1].a), &it[0].a);
  assert_null(tsr_list_prev(&h, &it[0].a));
  assert_true(tsr_list_linked(&it[3].a));
}

static void remove_is_idempotent(void **state) {
  (void)state;
  item it[3] = {{.v = 0}, {.v = 1}, {.v = 2}};
  tsr_list h;
  tsr_list_init(&h);
  for (int i = 0; i < 3; i++) tsr_list_push_back(&h, &it[i].a);
  tsr_list_remove(&it[1].a);
  assert_false(tsr_list_linked(&it[1].a));
  assert_string_equal(order(&h), "02");
  tsr_list_remove(&it[1].a); /* again: nothing happens */
  assert_string_equal(order(&h), "02");
  tsr_list_remove(&it[0].a);
  tsr_list_remove(&it[2].a);
  assert_true(tsr_list_empty(&h));
  /* a removed node can be linked again */
  tsr_list_push_back(&h, &it[1].a);
  assert_string_equal(order(&h), "1");
}

static void safe_walk_removes_every_other(void **state) {
  (void)state;
  item it[6];
  tsr_list h;
  tsr_list_init(&h);
  for (int i = 0; i < 6; i++) {
    it[i] = (item){.v = i};
    tsr_list_push_back(&h, &it[i].a);
  }
  tsr_list_foreach_safe(n, tmp, &h) {
    if (tsr_list_entry(n, item, a)->v % 2) tsr_list_remove(n);
  }
  assert_string_equal(order(&h), "024");
  tsr_list_foreach_safe(n, tmp, &h) tsr_list_remove(n);
  assert_true(tsr_list_empty(&h));
}

static void element_in_two_lists(void **state) {
  (void)state;
  item it[3] = {{.v = 0}, {.v = 1}, {.v = 2}};
  tsr_list ha, hb;
  tsr_list_init(&ha);
  tsr_list_init(&hb);
  for (int i = 0; i < 3; i++) {
    tsr_list_push_back(&ha, &it[i].a);
    tsr_list_push_front(&hb, &it[i].b);
  }
  tsr_list_remove(&it[1].a);
  assert_string_equal(order(&ha), "02");
  /* list b is untouched, in reverse */
  int seen[3], n = 0;
  tsr_list_foreach(x, &hb) seen[n++] = tsr_list_entry(x, item, b)->v;
  assert_int_equal(n, 3);
  assert_int_equal(seen[0], 2);
  assert_int_equal(seen[1], 1);
  assert_int_equal(seen[2], 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(pushes_and_inserts_keep_order),
      cmocka_unit_test(remove_is_idempotent),
      cmocka_unit_test(safe_walk_removes_every_other),
      cmocka_unit_test(element_in_two_lists),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
