#!/usr/bin/env bash
# What DiLoCo replicas of 1 and of 2 FSDP2 ranks put on the slow links, read off the emulated cluster's shapers:
# 2 replicas, each code, a short run of train.py (2 outer rounds); replicas of 2 ranks on a grouped cluster
# (10 Gbit/s within a replica, the rate between them), so that the slow class of each rank's port counts
# exactly what left its replica. Writes OUT/<code>-L<L>.jsonl (train.py's logs: the engine's own counts) and
# OUT/counters.txt (each rank's upload bytes on the slow links, and within its group).
#
#   sudo examples/diloco_lm/replica_bytes.sh OUT [PYTHON] [-- more train.py options]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: replica_bytes.sh OUT [PYTHON] [-- train.py options]}
shift
py=python3
if [[ $# -gt 0 && $1 != -- ]]; then
  py=$1
  shift
fi
[[ ${1:-} == -- ]] && shift
mkdir -p "$out"
tool=tools/netcluster/netcluster
for code in dense int8 e3m0 topk-0.03-c4096-2bit-b0.95-senders; do
  for L in 1 2; do
    n=$((2 * L)) name=rb$L
    if ((L == 2)); then
      "$tool" up -n 4 --name $name --groups 2 --group-rate 10gbit --rate 1gbit >/dev/null || exit 1
    else
      "$tool" up -n 2 --name $name --rate 1gbit >/dev/null || exit 1
    fi
    sparse=()
    [[ $code == topk* ]] && sparse=(--outer-lr 1 --outer-momentum 0)
    "$tool" run --name $name -- env OMP_NUM_THREADS=1 "$py" examples/diloco_lm/train.py --arm diloco \
      --replica-ranks $L --layers 6 --width 192 --batch 16 --steps 60 --eval-every 60 --eval-windows 32 \
      --sync-every 30 --compression $code "${sparse[@]}" --log "$out/$code-L$L.jsonl" "$@" >/dev/null 2>&1 ||
      echo "replica_bytes: $code with L = $L exited non-zero" >&2
    for ((k = 0; k < n; k++)); do
      ns=netcluster-$name-r$k
      if ((L == 2)); then
        slow=$(tc -n "$ns" -s class show dev eth0 | awk '/class htb 1:20/ { f = 1 } f && /Sent/ { print $2; exit }')
        fast=$(tc -n "$ns" -s class show dev eth0 | awk '/class htb 1:10/ { f = 1 } f && /Sent/ { print $2; exit }')
      else
        slow=$(tc -n "$ns" -s qdisc show dev eth0 | awk '/Sent/ { print $2; exit }') fast=0
      fi
      echo "$code L=$L rank $k slow_link_upload_bytes $slow in_group_upload_bytes $fast"
    done | tee -a "$out/counters.txt"
    "$tool" down --name $name >/dev/null
  done
done
