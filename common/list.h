/* An intrusive doubly-linked list, as libuv's queue and Linux's list_head:
 * the node lives inside the element, so linking and unlinking allocate
 * nothing, cannot fail, and an element leaves its list in O(1) without a
 * search.
 *
 * Happy path: the owner holds a tsr_list head (tsr_list_init() once), each
 * element embeds a tsr_list node; tsr_list_push_back(), tsr_list_remove(),
 * tsr_list_first() and tsr_list_entry() to get from a node back to its
 * element. A node that is zeroed or removed is "not linked"
 * (tsr_list_linked() == 0); removing it again is harmless.
 * Failure modes: none at run time; linking a node that is already in a
 * list corrupts both (the caller's contract). An element in two lists at
 * once embeds two nodes.
 *
 * Threads: none of its own; the owner's lock or loop thread guards it.
 */
#ifndef TSR_LIST_H
#define TSR_LIST_H

#include <stddef.h>

typedef struct tsr_list {
  struct tsr_list *next, *prev;
} tsr_list;

/* The element of type `type` whose member `member` is `node`. */
#define tsr_list_entry(node, type, member) \
  ((type *)((char *)(node) - offsetof(type, member)))

/* for (tsr_list *it = ...): `it` may not be removed inside the loop; use
 * tsr_list_foreach_safe (which keeps the next node in `tmp`) for that. */
#define tsr_list_foreach(it, head) \
  for (tsr_list *it = (head)->next; it != (head); it = it->next)
#define tsr_list_foreach_safe(it, tmp, head)                     \
  for (tsr_list *it = (head)->next, *tmp = it->next; it != (head); \
       it = tmp, tmp = it->next)

static inline void tsr_list_init(tsr_list *head) {
  head->next = head->prev = head;
}

static inline int tsr_list_empty(const tsr_list *head) {
  return head->next == head;
}

/* Whether a node (not a head) is in a list. */
static inline int tsr_list_linked(const tsr_list *node) {
  return node->next != NULL;
}

/* Puts `node` right after `at` (a head: at the front). */
static inline void tsr_list_insert_after(tsr_list *at, tsr_list *node) {
  node->prev = at;
  node->next = at->next;
  at->next->prev = node;
  at->next = node;
}

static inline void tsr_list_push_front(tsr_list *head, tsr_list *node) {
  tsr_list_insert_after(head, node);
}

static inline void tsr_list_push_back(tsr_list *head, tsr_list *node) {
  tsr_list_insert_after(head->prev, node);
}

/* Takes `node` out of its list; a node not linked is left alone. */
static inline void tsr_list_remove(tsr_list *node) {
  if (!node->next) return;
  node->prev->next = node->next;
  node->next->prev = node->prev;
  node->next = node->prev = NULL;
}

/* The first and last nodes, or NULL when the list is empty. */
static inline tsr_list *tsr_list_first(const tsr_list *head) {
  return head->next == head ? NULL : head->next;
}

static inline tsr_list *tsr_list_last(const tsr_list *head) {
  return head->prev == head ? NULL : head->prev;
}

/* The node after / before `node`, or NULL at the end. */
static inline tsr_list *tsr_list_next(const tsr_list *head,
                                      const tsr_list *node) {
  return node->next == head ? NULL : node->next;
}

static inline tsr_list *tsr_list_prev(const tsr_list *head,
                                      const tsr_list *node) {
  return node->prev == head ? NULL : node->prev;
}

/* A singly-linked FIFO held as a (head, tail) pair of element pointers,
 * the elements linked through their `next` member (NULL at the end):
 * appends the chain first..last (last->next already NULL) at the tail. */
#define tsr_fifo_append_chain(head, tail, first, last) \
  do {                                                 \
    if (tail)                                          \
      (tail)->next = (first);                          \
    else                                               \
      (head) = (first);                                \
    (tail) = (last);                                   \
  } while (0)

/* Appends one element (its `next` set to NULL) at the tail. */
#define tsr_fifo_append(head, tail, node)                   \
  do {                                                      \
    (node)->next = NULL;                                    \
    tsr_fifo_append_chain(head, tail, node, node);          \
  } while (0)

#endif /* TSR_LIST_H */
