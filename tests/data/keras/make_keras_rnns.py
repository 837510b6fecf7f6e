"""How tests/data/keras/*.tflite were made (TensorFlow 2.18.0, Keras 3, `pip install
tensorflow-cpu==2.18.0` in a separate venv; not a dependency of this package and not run by the
tests): Keras recurrent layers as TF's converter writes them by default. Keras 3's LSTM and GRU are
not fused into UNIDIRECTIONAL_SEQUENCE_LSTM: each layer is a WHILE whose body reads step i with
GATHER and, with return_sequences, writes it with CONCATENATION(SLICE(.., 0, i), h, SLICE(.., i + 1,
end)), the converter's lowering of TensorListSetItem. Weights are Keras's seeded
initialisers (tf.random.set_seed): the same versions give the same structure and weights, not
the same bytes (the converter's output varies in its metadata).

    python tests/data/keras/make_keras_rnns.py   # writes the five files here
"""
import os

import tensorflow as tf

F, H = 4, 8
HERE = os.path.dirname(os.path.abspath(__file__))


def save(name, inputs, outputs):
    model = tf.keras.Model(inputs, outputs)
    with open(os.path.join(HERE, f"{name}.tflite"), "wb") as f:
        f.write(tf.lite.TFLiteConverter.from_keras_model(model).convert())


def main():
    tf.random.set_seed(0)
    x = tf.keras.Input((6, F), batch_size=1)
    seq = tf.keras.layers.RNN(tf.keras.layers.LSTMCell(H), return_sequences=True)(x)
    save("keras_rnn_lstmcell", x, tf.keras.layers.Dense(3)(tf.keras.layers.RNN(tf.keras.layers.LSTMCell(H))(seq)))
    x = tf.keras.Input((6, F), batch_size=1)
    save("keras_lstm", x, tf.keras.layers.Dense(3)(tf.keras.layers.LSTM(H)(x)))
    tf.random.set_seed(1)
    x = tf.keras.Input((None, F), batch_size=1)          # the number of steps known only at run time
    save("keras_lstm_any_length", x,
         tf.keras.layers.Dense(3)(tf.keras.layers.LSTM(H, return_sequences=True)(x)))
    x = tf.keras.Input((5, F), batch_size=1)
    save("keras_gru", x, tf.keras.layers.GRU(H)(x))
    x = tf.keras.Input((5, F), batch_size=1)
    save("keras_bilstm", x, tf.keras.layers.Bidirectional(tf.keras.layers.LSTM(H))(x))


if __name__ == "__main__":
    main()
