#!/usr/bin/env bash
# call A: gemv_tokens against small_mma at M = 2-4, per shape and on the chained step
CALL=a1; source .gpu/fin/pre.sh
V='{"small_mma": {}, "t32w8": {"PATH": "gemv_tokens", "BN": 32, "GC": 8, "num_warps": 8}, "t16w4": {"PATH": "gemv_tokens", "BN": 16, "GC": 8, "num_warps": 4}, "t32w4": {"PATH": "gemv_tokens", "BN": 32, "GC": 8, "num_warps": 4}}'
timeout 200 python3 tools/tune/step_ab.py $OUT/ab-shapes.json --m 2,4 --shapes gate_up,down,out,in_proj,qkv,lm_head --no-step --sol --rounds 5 --variants "$V" > $OUT/ab-shapes.log 2>&1
at shapes $?
timeout 200 python3 tools/tune/step_ab.py $OUT/ab-step.json --m 2,3,4 --rounds 7 --variants "$V" > $OUT/ab-step.log 2>&1
at step $?
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv >> $OUT/env-$CALL.txt
grep -E "M=|failed|Error" $OUT/ab-shapes.log | cut -c1-200 | head -80; grep -E "step|failed|Error|clocks" $OUT/ab-step.log | cut -c1-220
