/* tmpl built-ins, internal: helpers shared by tmpl_builtins.c (access, globals),
 * tmpl_strops.c (string operations), tmpl_format.c (str.format and %), tmpl_methods.c,
 * tmpl_filters.c and tmpl_tests.c. */
#ifndef CAIRN_TMPL_TMPL_BUILTINS_INT_H
#define CAIRN_TMPL_TMPL_BUILTINS_INT_H

#include "tmpl/tmpl_int.h"

#define TMPL_TV_LISTV(x_) ((struct tmpl_tv){.t = TMPL_TV_LIST, .u.l = (x_)})
#define TMPL_TV_DICTV(x_) ((struct tmpl_tv){.t = TMPL_TV_DICT, .u.d = (x_)})

/* tmpl_builtins.c */
int tmpl_bi_in(const char *const *list, const char *name);
struct tmpl_tv tmpl_bi_list_of(struct tmpl_rstate *r, size_t n);
int64_t tmpl_bi_need_int(struct tmpl_rstate *r, struct tmpl_tv v, const char *what);
struct tmpl_tv tmpl_bi_need_str(struct tmpl_rstate *r, struct tmpl_tv v, const char *what);
int tmpl_bi_pyattr(struct tmpl_rstate *r, struct tmpl_tv obj, const char *name, struct tmpl_tv *out);
int tmpl_bi_streq(struct tmpl_tv v, const char *s);
void tmpl_bi_undef_fail(struct tmpl_rstate *r, struct tmpl_tv v);
/* tmpl_strops.c */
int tmpl_bi_affix(struct tmpl_tv s, struct tmpl_tv a, int end);
struct tmpl_tv tmpl_bi_capitalize(struct tmpl_rstate *r, struct tmpl_tv s);
int64_t tmpl_bi_cp_index(struct tmpl_tv s, size_t byte_off);
struct tmpl_tv tmpl_bi_jtitle(struct tmpl_rstate *r, struct tmpl_tv s);
struct tmpl_tv tmpl_bi_map_case(struct tmpl_rstate *r, struct tmpl_tv s, int mode);
struct tmpl_tv tmpl_bi_pad(struct tmpl_rstate *r, struct tmpl_tv s, int64_t width, struct tmpl_tv fill, int mode);
struct tmpl_tv tmpl_bi_pytitle(struct tmpl_rstate *r, struct tmpl_tv s);
struct tmpl_tv tmpl_bi_replace(struct tmpl_rstate *r, struct tmpl_tv s, struct tmpl_tv old, struct tmpl_tv new_, int64_t count);
struct tmpl_tv tmpl_bi_split(struct tmpl_rstate *r, struct tmpl_tv s, struct tmpl_tv sep, int64_t maxsplit, int from_right);
struct tmpl_tv tmpl_bi_strip(struct tmpl_tv s, struct tmpl_tv chars, int left, int right);
/* tmpl_format.c */
struct tmpl_tv tmpl_bi_format(struct tmpl_rstate *r, struct tmpl_tv fmt, struct tmpl_args *a);
/* tmpl_methods.c */
struct tmpl_tv tmpl_bi_arg(struct tmpl_args *a, size_t i, const char *name, struct tmpl_tv def);
int tmpl_bi_is_alpha_cp(uint32_t cp);
int tmpl_bi_is_digit_cp(uint32_t cp);
struct tmpl_tv tmpl_bi_items_list(struct tmpl_rstate *r, struct tmpl_tv_dict *d);
struct tmpl_tv tmpl_bi_str_pred(struct tmpl_tv s, const char *name);

#endif
