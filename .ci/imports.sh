#!/usr/bin/env bash
# Checks the import rules of DESIGN.md with go list:
#   (the root)    package resilience (Version): standard library only, so
#                 that any package may import it
#   codes         standard library, grpc/codes and grpc/status only
#   serviceconfig standard library, our codes, grpc/codes only: no grpc runtime
#   deadline      standard library only
#   internal/...  (engines) no google.golang.org/grpc root package, and none of
#                 our packages but other internal engines
#   examples/...  public packages only (nothing internal)
#   interceptor   (the client) not interceptor/server, nor the server's stores
#                 (interceptor/idempotency/..., interceptor/ratelimit/redisquota):
#                 neither side imports the other
#   interceptor/server
#                 not interceptor (the client package itself; its sub-packages
#                 wire, idempotency and internal/... are fine)
#   interceptor/idempotency/...
#                 the server's records and stores: not interceptor (the
#                 client), except the outbox relay
#                 (interceptor/idempotency/pgstore/outbox), which delivers
#                 its messages through the client
#   interceptor/wire
#                 the leaf both sides share: standard library and
#                 google.golang.org/grpc/metadata only, nothing of ours
#   interceptor/internal/...
#                 helpers of both sides: of ours, only other internal packages
#                 (internal/..., interceptor/internal/...), serviceconfig, codes
#                 and generated code (proto/...: the test servers' echo service)
#   interceptor/admin
#                 the admin view: the observer of both sides, so it may import
#                 the client (interceptor), the server (interceptor/server) and
#                 the endpoint policy; nothing of ours imports it but examples
#                 and commands: no side depends on being observed
#   faultinject, resiliencetest
#                 testing aids for users: public packages only (nothing internal);
#                 they may import grpc
#   google.golang.org/grpc (the runtime) only from interceptor/..., faultinject,
#                 resiliencetest, proto/... (generated code), examples/... and cmd/...
set -euo pipefail
cd "$(dirname "$0")/.."
mod=$(GOWORK=off go list -m) # the library's path (go.work lists the examples and bench modules too)
fail=0

# std lists standard-library import paths.
is_std() { [[ "$1" != *.* ]]; }

check() { # package, import, verdict
	echo "import rule: $1 must not import $2 ($3)" >&2
	fail=1
}

while read -r pkg imports; do
	rel=${pkg#"$mod"}
	rel=${rel#/}
	for imp in $imports; do
		case "$rel" in
		"")
			is_std "$imp" || check "$mod" "$imp" "the root package: standard library only"
			;;
		codes)
			is_std "$imp" || [[ "$imp" == google.golang.org/grpc/codes || "$imp" == google.golang.org/grpc/status ]] ||
				check "$rel" "$imp" "standard library, grpc/codes and grpc/status only"
			;;
		serviceconfig)
			is_std "$imp" || [[ "$imp" == "$mod/codes" || "$imp" == google.golang.org/grpc/codes ]] ||
				check "$rel" "$imp" "pure data: standard library and our codes only"
			;;
		deadline)
			is_std "$imp" || check "$rel" "$imp" "standard library only"
			;;
		internal/*)
			if [[ "$imp" == google.golang.org/grpc ]]; then
				check "$rel" "$imp" "engines know nothing of grpc"
			elif [[ "$imp" == "$mod"/* && "$imp" != "$mod"/internal/* ]]; then
				check "$rel" "$imp" "engines import nothing of ours above them"
			fi
			;;
		interceptor)
			case "$imp" in
			"$mod"/interceptor/server | "$mod"/interceptor/server/* | "$mod"/interceptor/idempotency | "$mod"/interceptor/idempotency/* | "$mod"/interceptor/ratelimit/redisquota)
				check "$rel" "$imp" "the client imports nothing of the server's: neither side imports the other"
				;;
			esac
			;;
		interceptor/server)
			[[ "$imp" != "$mod"/interceptor ]] ||
				check "$rel" "$imp" "the server imports nothing of the client's: neither side imports the other"
			;;
		interceptor/idempotency/pgstore/outbox) ;; # the relay: a client of the receiver's
		interceptor/idempotency | interceptor/idempotency/*)
			[[ "$imp" != "$mod"/interceptor ]] ||
				check "$rel" "$imp" "the server's stores import nothing of the client's (the outbox relay alone delivers through it)"
			;;
		interceptor/wire)
			is_std "$imp" || [[ "$imp" == google.golang.org/grpc/metadata ]] ||
				check "$rel" "$imp" "the wire leaf: standard library and grpc/metadata only"
			;;
		interceptor/internal/*)
			case "$imp" in
			"$mod"/internal/* | "$mod"/interceptor/internal/* | "$mod"/serviceconfig | "$mod"/codes | "$mod"/proto/*) ;;
			"$mod" | "$mod"/*) check "$rel" "$imp" "the sides' internal helpers import nothing of ours above them" ;;
			esac
			;;
		examples/* | faultinject | resiliencetest)
			if [[ "$imp" == "$mod"/*internal* ]]; then
				check "$rel" "$imp" "examples and testing aids use public packages only"
			fi
			;;
		esac
		if [[ "$imp" == "$mod"/interceptor/admin ]]; then
			case "$rel" in
			examples/* | cmd/*) ;;
			*) check "$rel" "$imp" "the admin view observes both sides; only examples and commands import it" ;;
			esac
		fi
		if [[ "$imp" == google.golang.org/grpc ]]; then
			case "$rel" in
			interceptor | interceptor/* | faultinject | resiliencetest | proto/* | examples/* | cmd/*) ;;
			*) check "$rel" "$imp" "only interceptor, faultinject, resiliencetest, generated code, examples and commands use the grpc runtime" ;;
			esac
		fi
	done
done < <(go list -f '{{.ImportPath}} {{join .Imports " "}}' ./... ./examples/...)

if [[ $fail -ne 0 ]]; then
	exit 1
fi
echo "import rules: ok"
