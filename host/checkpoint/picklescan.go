package checkpoint

import (
	"encoding/binary"
	"fmt"
	"math"
)

// checkPickle walks a pickle's opcodes, without running them, and refuses
// any whose declared length runs past the end of the data. gopickle
// allocates what an opcode declares before reading it, so an 8-byte length
// in a few bytes of input would otherwise allocate gigabytes. Opcodes as
// in Python's pickletools, protocols 0 to 5.
func checkPickle(data []byte) error {
	at := 0
	need := func(n uint64, op byte) error {
		if n > uint64(len(data)-at) {
			return fmt.Errorf("corrupt pickle: opcode %q at byte %d declares %d bytes, but only %d remain", op, at-1, n, len(data)-at)
		}
		return nil
	}
	line := func(op byte) error {
		for i := at; i < len(data); i++ {
			if data[i] == '\n' {
				at = i + 1
				return nil
			}
		}
		return fmt.Errorf("corrupt pickle: opcode %q at byte %d has no end of line", op, at-1)
	}
	for at < len(data) {
		op := data[at]
		at++
		var err error
		switch op {
		case '.': // STOP
			return nil
		case '(', '0', '1', '2', 'N', 'R', 'a', 'b', 'd', '}', 'e', 'l', ']', 'o', 's', 't', ')', 'u', 'Q',
			0x81, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8f, 0x90, 0x91, 0x92, 0x93, 0x94, 0x97, 0x98:
		case 'K', 'h', 'q', 0x82, 0x80:
			err = need(1, op)
			at++
		case 'M', 0x83:
			err = need(2, op)
			at += 2
		case 'J', 'j', 'r', 0x84:
			err = need(4, op)
			at += 4
		case 'G', 0x95: // BINFLOAT; FRAME declares the length of what follows
			if err = need(8, op); err == nil {
				n := binary.LittleEndian.Uint64(data[at:])
				at += 8
				if op == 0x95 {
					err = need(n, op)
				}
			}
		case 'I', 'L', 'F', 'S', 'V', 'P', 'g', 'p':
			err = line(op)
		case 'c', 'i':
			if err = line(op); err == nil {
				err = line(op)
			}
		case 'U', 0x8c, 'C', 0x8a: // 1-byte length
			if err = need(1, op); err == nil {
				n := uint64(data[at])
				at++
				if err = need(n, op); err == nil {
					at += int(n)
				}
			}
		case 'T', 'X', 'B', 0x8b: // 4-byte length
			if err = need(4, op); err == nil {
				n := uint64(binary.LittleEndian.Uint32(data[at:]))
				at += 4
				if err = need(n, op); err == nil {
					at += int(n)
				}
			}
		case 0x8d, 0x8e, 0x96: // 8-byte length
			if err = need(8, op); err == nil {
				n := binary.LittleEndian.Uint64(data[at:])
				at += 8
				if n > math.MaxInt32 {
					return fmt.Errorf("corrupt pickle: opcode %q declares %d bytes", op, n)
				}
				if err = need(n, op); err == nil {
					at += int(n)
				}
			}
		default:
			return fmt.Errorf("corrupt pickle: unknown opcode 0x%02x at byte %d", op, at-1)
		}
		if err != nil {
			return err
		}
	}
	return fmt.Errorf("corrupt pickle: no STOP opcode")
}
